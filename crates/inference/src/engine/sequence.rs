//! [`Sequence`]: what one request keeps between decode steps (sampler, streaming detokenizer,
//! stop matcher, the tokens so far and the result being built), independent of how its logits
//! are computed (by [`super::BatchEngine`], alone or in a batch).

use crate::sample::{top_logprobs, Pick, Picked, Sampler, StopMatcher, StopResult};
use crate::tokenizer::DecodeStream;

use super::request::{FinishReason, GenerateRequest, Generation, TokenLogprob};
use super::TextModel;

/// The decode-side state of one request.
pub struct Sequence<'m> {
    model: &'m TextModel,
    req: GenerateRequest,
    sampler: Sampler,
    stream: DecodeStream<'m>,
    stops: StopMatcher,
    history: Vec<u32>,
    out: Generation,
    done: bool,
    /// The request's place in its output constraint.
    matcher: Option<crate::grammar::Matcher>,
    /// See [`Sequence::take_void`].
    void_plan: bool,
}

impl<'m> Sequence<'m> {
    /// Starts a request whose first `cached` prompt tokens are already in its state.
    pub fn new(model: &'m TextModel, req: GenerateRequest, cached: usize) -> Self {
        let out = Generation {
            text: String::new(),
            token_ids: Vec::new(),
            prompt_tokens: req.prompt_ids.len(),
            cached_prompt_tokens: cached,
            finish_reason: FinishReason::Length,
            error: None,
            logprobs: Vec::new(),
            drafted_tokens: 0,
            drafts: 0,
            accepted_tokens: 0,
            prefill_secs: 0.0,
            decode_secs: 0.0,
        };
        Self {
            model,
            sampler: Sampler::new(req.sampling.clone()),
            stream: model.tokenizer.decode_stream(!req.keep_special_tokens),
            stops: StopMatcher::new(req.stop.clone()),
            history: req.prompt_ids.clone(),
            matcher: req.constraint.as_ref().map(|c| c.matcher()),
            req,
            out,
            done: false,
            void_plan: false,
        }
    }

    /// The request.
    pub fn request(&self) -> &GenerateRequest {
        &self.req
    }

    /// Prompt and generated tokens so far.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Records how many prompt tokens came from a cache instead of being run.
    pub fn set_cached_prompt_tokens(&mut self, n: usize) {
        self.out.cached_prompt_tokens = n;
    }

    /// Records the time spent on the prompt and on the decode steps.
    pub fn set_timing(&mut self, prefill_secs: f64, decode_secs: f64) {
        self.out.prefill_secs = prefill_secs;
        self.out.decode_secs = decode_secs;
    }

    /// Whether the sequence has ended.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Consumes the logits of the sequence's last token: samples the next token, records it,
    /// streams its text through `on_text` (which returns `false` to cancel) and checks the stop
    /// conditions. Returns the token to run next, or `None` when the sequence has ended.
    /// `room` says whether the state can take one more token.
    pub fn accept(
        &mut self,
        logits: &[f32],
        room: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Option<u32> {
        let pick = self.pick(logits);
        self.accept_pick(pick, room, on_text)
    }

    /// The choice half of [`Sequence::accept`]: reshapes the logits (the bias added, then
    /// everything the output constraint does not allow next set to -inf), samples, and records
    /// the log-probabilities (of the model's own logits). Touches only this sequence, so a
    /// batch picks for all its sequences in parallel, then hands each pick to
    /// [`Sequence::accept_pick`] in order. `None` when the sequence has ended or its constraint
    /// failed.
    pub fn pick(&mut self, logits: &[f32]) -> Option<u32> {
        self.choose(logits, None).map(|(t, _)| t)
    }

    /// [`Sequence::pick`] at a position where a speculative draft proposed `draft`: the
    /// token and whether it is the draft's ([`Sampler::sample_draft`]: the output keeps the
    /// distribution of plain sampling; greedy keeps the argmax).
    pub fn pick_draft(&mut self, logits: &[f32], draft: u32) -> Option<(u32, bool)> {
        self.choose(logits, Some(draft))
    }

    fn choose(&mut self, logits: &[f32], draft: Option<u32>) -> Option<(u32, bool)> {
        if self.done {
            return None;
        }
        let shaped = if self.matcher.is_some() || !self.req.logit_bias.is_empty() {
            let mut l = logits.to_vec();
            for &(id, b) in &self.req.logit_bias {
                if let Some(x) = l.get_mut(id as usize) {
                    *x += b;
                }
            }
            if let Some(m) = &mut self.matcher {
                if let Err(e) = m.mask(&mut l) {
                    self.out.error = Some(e.to_string());
                    return None;
                }
                // Through end-of-sequence tokens means past the constraint's own end too,
                // while it allows anything else.
                let stops = &self.model.stop_token_ids;
                if self.req.ignore_eos
                    && l.iter()
                        .enumerate()
                        .any(|(i, x)| x.is_finite() && !stops.contains(&(i as u32)))
                {
                    for &t in stops {
                        if let Some(x) = l.get_mut(t as usize) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            Some(l)
        } else {
            None
        };
        let shaped = shaped.as_deref().unwrap_or(logits);
        let prompt_len = self.req.prompt_ids.len();
        let (picked, drafted) = match draft {
            Some(d) => self
                .sampler
                .sample_draft(shaped, &self.history, prompt_len, d),
            None => (
                self.sampler.sample(shaped, &self.history, prompt_len),
                false,
            ),
        };
        if let Some(n) = self.req.logprobs {
            self.out.logprobs.push(TokenLogprob {
                token: picked.token,
                logprob: picked.logprob,
                top: top_logprobs(logits, n),
            });
        }
        Some((picked.token, drafted))
    }

    /// The rest of [`Sequence::accept`] for a [`Sequence::pick`]: records the token, streams
    /// its text, checks the stop conditions (a failed pick ends the sequence, with
    /// [`Generation::error`] set when its constraint failed).
    pub fn accept_pick(
        &mut self,
        pick: Option<u32>,
        room: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Option<u32> {
        if self.done {
            return None;
        }
        match pick {
            Some(token) => self.push_token(token, room, on_text),
            None => self.end(FinishReason::Stop, on_text),
        }
    }

    /// Whether the next choice can be made where the logits are ([`Sequence::plan`]): not
    /// when an output constraint masks the logits or log-probabilities are reported.
    pub fn can_plan(&self) -> bool {
        !self.done && self.matcher.is_none() && self.req.logprobs.is_none()
    }

    /// The next choice as a [`Pick`], made where the logits are ([`crate::ops::pick_rows`]):
    /// the request's bias, its penalties and the random draw, taken now
    /// ([`Sampler::plan`]). The token picked goes to [`Sequence::accept_picked`].
    pub fn plan(&mut self) -> Pick {
        let vocab = self.model.decoder.info().config.vocab_size;
        self.sampler.plan(
            &self.history,
            self.req.prompt_ids.len(),
            &self.req.logit_bias,
            vocab,
        )
    }

    /// [`Sequence::accept_token`] of a token picked by a [`Sequence::plan`] (or the argmax),
    /// settling the random stream ([`Sampler::settle`]). When a later plan's draw became void
    /// (see [`Sequence::take_void`]), that is noted.
    pub fn accept_picked(
        &mut self,
        picked: Picked,
        room: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Option<u32> {
        self.void_plan |= self.sampler.settle(picked);
        self.accept_token(picked.token, room, on_text)
    }

    /// Whether a plan made before the last pick was settled drew from a random stream that
    /// pick rewound (it drew nothing): that plan's pick must be made again. Cleared here.
    pub fn take_void(&mut self) -> bool {
        std::mem::take(&mut self.void_plan)
    }

    /// Whether a void plan waits for [`Sequence::take_void`].
    pub fn has_void_plan(&self) -> bool {
        self.void_plan
    }

    /// Whether [`Sequence::plan`] needs no token it has not seen yet: no penalty depends on
    /// the history (the logit bias and the random draw do not).
    pub fn plans_ahead(&self) -> bool {
        let p = &self.req.sampling;
        p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0
    }

    /// Whether the next token is the plain argmax of the logits (greedy, no penalties, no
    /// log-probabilities), so the model may pick it where the logits are
    /// ([`Sequence::accept_token`]).
    pub fn picks_argmax(&self) -> bool {
        self.req.picks_argmax()
    }

    /// [`Sequence::accept`] of a token the model already picked (see
    /// [`Sequence::picks_argmax`]).
    pub fn accept_token(
        &mut self,
        token: u32,
        room: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Option<u32> {
        if self.done {
            return None;
        }
        self.push_token(token, room, on_text)
    }

    fn push_token(
        &mut self,
        token: u32,
        room: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Option<u32> {
        self.out.token_ids.push(token);
        self.history.push(token);
        if !self.req.ignore_eos && self.model.stop_token_ids.contains(&token) {
            return self.end(FinishReason::Stop, on_text);
        }
        let complete = match &mut self.matcher {
            Some(m) => match m.accept(token) {
                Ok(()) => m.is_done(),
                Err(e) => {
                    self.out.error = Some(e.to_string());
                    return self.end(FinishReason::Stop, on_text);
                }
            },
            None => false,
        };
        if let Some(piece) = self.stream.step(token) {
            match self.stops.push(&piece) {
                StopResult::Continue(text) => {
                    self.out.text.push_str(&text);
                    if !text.is_empty() && !on_text(&text) {
                        return self.end(FinishReason::Cancelled, on_text);
                    }
                }
                StopResult::Stop(text) => {
                    self.out.text.push_str(&text);
                    if !text.is_empty() {
                        on_text(&text);
                    }
                    return self.end(FinishReason::Stop, on_text);
                }
            }
        }
        if complete {
            // The constraint allows nothing more: the output is whole (held-back text too).
            let rest = self.stops.finish();
            if !rest.is_empty() {
                self.out.text.push_str(&rest);
                on_text(&rest);
            }
            return self.end(FinishReason::Stop, on_text);
        }
        if self.out.token_ids.len() >= self.req.max_tokens || !room {
            return self.end(FinishReason::Length, on_text);
        }
        Some(token)
    }

    /// Ends the sequence; at the length limit, text held back for stop strings is released.
    fn end(&mut self, reason: FinishReason, on_text: &mut dyn FnMut(&str) -> bool) -> Option<u32> {
        self.done = true;
        self.out.finish_reason = reason;
        if reason == FinishReason::Length {
            let rest = self.stops.finish();
            if !rest.is_empty() {
                self.out.text.push_str(&rest);
                on_text(&rest);
            }
        }
        None
    }

    /// Cuts a speculative draft to the tokens the output constraint allows from here.
    pub(crate) fn trim_draft(&mut self, draft: &mut Vec<u32>) {
        if let Some(m) = &mut self.matcher {
            let n = m.valid_prefix(draft);
            draft.truncate(n);
        }
    }

    /// Counts a verified draft of `drafted` tokens of which `accepted` were kept.
    pub(crate) fn count_draft(&mut self, drafted: usize, accepted: usize) {
        self.out.drafted_tokens += drafted;
        self.out.drafts += 1;
        self.out.accepted_tokens += accepted;
    }

    /// The result so far (text, tokens and log-probabilities grow as the sequence runs).
    pub fn generation(&self) -> &Generation {
        &self.out
    }

    /// The finished result.
    pub fn into_generation(self) -> Generation {
        self.out
    }
}
