//! [`BatchEngine`]: continuous batching over one model. Requests join between steps; every
//! step is a single [`Decoder::forward`](crate::model::decoder::Decoder::forward) over the next
//! prompt chunk of each request still prefilling and the last sampled token of each request
//! decoding, so the weights are read once per step for the whole batch. A request leaves as soon
//! as it ends; its state is freed with it. [`BatchEngine::step_with`] streams each request's new
//! text as it is produced; [`BatchEngine::cancel`] drops a request (its client went away).

use std::collections::VecDeque;

use crate::model::decoder::Outputs;
use crate::state::SeqState;
use crate::{Error, Result};

use super::generate::{FinishReason, GenerateRequest, Generation, TokenLogprob, PREFILL_CHUNK};
use super::sequence::Sequence;
use super::TextModel;

/// One request in flight.
struct Slot<'m> {
    id: u64,
    seq: Sequence<'m>,
    state: SeqState,
    /// Prompt tokens already run.
    prefilled: usize,
    /// The token to run next once the prompt is done.
    next: Option<u32>,
    /// Bytes of text and log-probability entries already streamed.
    sent_text: usize,
    sent_logprobs: usize,
    /// The caller asked to stop this request.
    cancelled: bool,
}

/// What one request produced in one step, for streaming.
#[derive(Debug)]
pub struct StepUpdate<'a> {
    /// The request.
    pub id: u64,
    /// Text new since the last update (may be empty: held back for stop strings, or a token
    /// without text of its own yet).
    pub text: &'a str,
    /// Log-probabilities of the tokens new since the last update, when the request asked.
    pub logprobs: &'a [TokenLogprob],
    /// Tokens generated so far.
    pub generated: usize,
}

/// Runs many generation requests together.
pub struct BatchEngine<'m> {
    model: &'m TextModel,
    max_running: usize,
    prefill_budget: usize,
    waiting: VecDeque<(u64, GenerateRequest)>,
    running: Vec<Slot<'m>>,
    next_id: u64,
}

impl<'m> BatchEngine<'m> {
    /// An engine that decodes at most `max_running` sequences at once and prefills at most
    /// [`PREFILL_CHUNK`] prompt tokens per step.
    pub fn new(model: &'m TextModel, max_running: usize) -> Self {
        Self {
            model,
            max_running: max_running.max(1),
            prefill_budget: PREFILL_CHUNK,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
        }
    }

    /// Queues a request; returns its id. Invalid requests are refused here.
    pub fn submit(&mut self, req: GenerateRequest) -> Result<u64> {
        req.sampling.validate()?;
        let context = self.model.decoder.info().config.max_positions;
        if req.prompt_ids.is_empty() {
            return Err(Error::InvalidInput("the prompt has no tokens".into()));
        }
        if req.prompt_ids.len() >= context {
            return Err(Error::InvalidInput(format!(
                "the prompt has {} tokens; the context holds {context}",
                req.prompt_ids.len()
            )));
        }
        let vocab = self.model.decoder.info().config.vocab_size;
        if let Some(bad) = req.prompt_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {vocab} tokens"
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, req));
        Ok(id)
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Requests queued, not yet admitted.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests admitted (prefilling or decoding).
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Drops a request, queued or running, and frees its state. Returns what it had generated
    /// (finish reason [`FinishReason::Cancelled`]), or `None` for an unknown id.
    pub fn cancel(&mut self, id: u64) -> Option<Generation> {
        if let Some(i) = self.waiting.iter().position(|(w, _)| *w == id) {
            let (_, req) = self.waiting.remove(i)?;
            let mut out = Sequence::new(self.model, req, 0).into_generation();
            out.finish_reason = FinishReason::Cancelled;
            return Some(out);
        }
        let i = self.running.iter().position(|s| s.id == id)?;
        let mut out = self.running.swap_remove(i).seq.into_generation();
        out.finish_reason = FinishReason::Cancelled;
        Some(out)
    }

    /// One step: admits waiting requests, runs one batched forward pass, samples, and returns
    /// the requests that ended in this step with their results.
    pub fn step(&mut self) -> Result<Vec<(u64, Generation)>> {
        self.step_with(&mut |_| true)
    }

    /// [`BatchEngine::step`], calling `on_update` for every request that sampled a token in this
    /// step (before the ended ones are returned). `on_update` returning `false` cancels that
    /// request: it ends with [`FinishReason::Cancelled`] and is returned with the others.
    pub fn step_with(
        &mut self,
        on_update: &mut dyn FnMut(StepUpdate<'_>) -> bool,
    ) -> Result<Vec<(u64, Generation)>> {
        while self.running.len() < self.max_running {
            let Some((id, req)) = self.waiting.pop_front() else {
                break;
            };
            let max_len = req.prompt_ids.len().saturating_add(req.max_tokens.max(1));
            let state = self.model.new_cache(max_len);
            let seq = Sequence::new(self.model, req, 0);
            self.running.push(Slot {
                id,
                seq,
                state,
                prefilled: 0,
                next: None,
                sent_text: 0,
                sent_logprobs: 0,
                cancelled: false,
            });
        }
        if self.running.is_empty() {
            return Ok(Vec::new());
        }
        // Build the batch, in slot order: one token for each decoding sequence, the next
        // prompt chunk (within the step's budget) for each prefilling one.
        let mut ids = Vec::new();
        let mut lens = Vec::new();
        let mut members = Vec::new();
        let mut budget = self.prefill_budget;
        for (i, slot) in self.running.iter().enumerate() {
            let prompt = &slot.seq.request().prompt_ids;
            if let Some(t) = slot.next {
                ids.push(t);
                lens.push(1);
                members.push(i);
            } else if slot.prefilled < prompt.len() && budget > 0 {
                let n = (prompt.len() - slot.prefilled).min(budget);
                ids.extend_from_slice(&prompt[slot.prefilled..slot.prefilled + n]);
                lens.push(n);
                members.push(i);
                budget -= n;
            }
        }
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let logits = {
            let mut states: Vec<&mut SeqState> = self
                .running
                .iter_mut()
                .enumerate()
                .filter(|(i, _)| members.binary_search(i).is_ok())
                .map(|(_, slot)| &mut slot.state)
                .collect();
            self.model
                .decoder
                .forward(&ids, &lens, &mut states, Outputs::LastLogits)?
        };
        let vocab = logits.len() / members.len();
        for (row, &i) in members.iter().enumerate() {
            let slot = &mut self.running[i];
            let from_prompt = slot.next.is_none();
            if from_prompt {
                slot.prefilled += lens[row];
                if slot.prefilled < slot.seq.request().prompt_ids.len() {
                    continue; // more prompt to run before sampling
                }
                if slot.seq.request().max_tokens == 0 {
                    continue;
                }
            }
            let room = slot.state.len() < slot.state.max_len();
            slot.next = slot
                .seq
                .accept(&logits[row * vocab..(row + 1) * vocab], room, &mut |_| true);
            let out = slot.seq.generation();
            let keep = on_update(StepUpdate {
                id: slot.id,
                text: &out.text[slot.sent_text..],
                logprobs: &out.logprobs[slot.sent_logprobs..],
                generated: out.token_ids.len(),
            });
            slot.sent_text = out.text.len();
            slot.sent_logprobs = out.logprobs.len();
            if !keep {
                slot.cancelled = true;
            }
        }
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let slot = &self.running[i];
            let prompt_done = slot.prefilled >= slot.seq.request().prompt_ids.len();
            let ended = slot.seq.is_done() || (prompt_done && slot.seq.request().max_tokens == 0);
            if ended || slot.cancelled {
                let slot = self.running.swap_remove(i);
                let mut out = slot.seq.into_generation();
                if slot.cancelled && !ended {
                    out.finish_reason = FinishReason::Cancelled;
                }
                finished.push((slot.id, out));
            } else {
                i += 1;
            }
        }
        Ok(finished)
    }

    /// Steps until every queued request has ended; results in submission order.
    pub fn run_all(&mut self) -> Result<Vec<(u64, Generation)>> {
        let mut done = Vec::new();
        while self.pending() > 0 {
            done.extend(self.step()?);
        }
        done.sort_by_key(|(id, _)| *id);
        Ok(done)
    }
}
