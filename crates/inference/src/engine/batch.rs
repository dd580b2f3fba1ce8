//! [`BatchEngine`]: the one engine loop every generation goes through (the server's
//! continuous batching, and `generate` / `chat` as a batch of one). Each step is
//! `Scheduler::schedule` (who runs how many tokens, with memory for them), one
//! [`ForwardBatch`] through
//! [`Decoder::forward_batch`](crate::model::decoder::Decoder::forward_batch), and
//! [`BatchEngine::update_from_output`] (sample, stream, publish finished pages to the prefix
//! cache, end requests). Requests join between steps; a request's memory is freed as soon as
//! it ends. [`BatchEngine::cancel`] drops a request (its client went away).
//!
//! Decode steps may run ahead (on a GPU by default; `LATTICE_OVERLAP=0|1`): while every running
//! request picks its next token on the device with nothing the host must see first, step n + 1
//! is launched, its tokens being step n's picks still on the device, before step n's picks are
//! read, so the host's work for a step (scheduling, the forward pass's host side, streaming)
//! runs while the device computes the one before (vLLM's async scheduling). A request then
//! learns of its end one step late: the step after its last token computed a row nobody reads.
//! A sampled request's draw for step n + 1 is planned before step n's pick says whether it drew;
//! when it did not (nothing was drawable), that draw is void and the row runs again, so such
//! requests run ahead only where a state can drop its last row (not a recurrent one)
//! (`LATTICE_OVERLAP_SAMPLED=0` or [`BatchEngine::set_overlap_sampled`] keeps them serial).

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::attention::ROW_BY_ROW;
use crate::model::batch::{ForwardBatch, InjectedRows, Positions, RowOutputs};
use crate::model::decoder::REPLAYED_ROWS;
use crate::ops::StepPicks;
use crate::sample::{Pick, Picked};
use crate::state::SeqState;
use crate::{Error, Result};

use super::memory::{KvMemory, MemoryConfig, MemoryStats};
use super::multimodal::PromptImages;
use super::request::{FinishReason, GenerateRequest, Generation, TokenLogprob};
use super::scheduler::{Schedule, Scheduler, Slot};
use super::sequence::Sequence;
use super::speculate::{self, Drafter, StepCost};
use super::suffix::{suffix_draft, SuffixCache};
use super::TextModel;

/// Prompt tokens per step: bounds the activations of very long prompts.
pub(crate) const PREFILL_CHUNK: usize = 512;

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

/// How an engine runs.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// Most sequences admitted at once.
    pub max_running: usize,
    /// Most prompt tokens run per step (decode tokens come on top).
    pub prefill_chunk: usize,
    /// The memory: budget, page size, prefix caching.
    pub memory: MemoryConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_running: 16,
            prefill_chunk: PREFILL_CHUNK,
            memory: MemoryConfig::default(),
        }
    }
}

/// A state handed back when its request ended (see [`BatchEngine::submit_with_state`]).
#[derive(Debug)]
pub struct KeptState {
    /// The state after the request (prompt and generated tokens, but the last one).
    pub state: SeqState,
    /// Recurrent models: the state at the end of the prompt.
    pub checkpoint: Option<SeqState>,
}

/// Runs many generation requests together.
pub struct BatchEngine<'m> {
    model: &'m TextModel,
    scheduler: Scheduler,
    memory: KvMemory,
    waiting: VecDeque<Slot<'m>>,
    running: Vec<Slot<'m>>,
    kept: HashMap<u64, KeptState>,
    next_id: u64,
    /// Whether the model can draft for speculative decoding ([`TextModel::draft_refusal`]).
    drafts: bool,
    /// Outputs of finished requests that drafted by suffix match, for later requests' drafts.
    suffix_cache: SuffixCache,
    /// The forward pass's cost by rows, which bounds the drafts when the batch is
    /// compute-bound.
    step_cost: StepCost,
    /// Step times (for `LATTICE_TRACE_STEPS`).
    trace: StepTrace,
    /// Whether decode steps may run ahead of their read (see the module comment).
    overlap: bool,
    /// Whether sampled requests may run ahead too (see the module comment).
    overlap_sampled: bool,
    /// The decode step launched and not yet read.
    ahead: Option<Ahead>,
    /// Decode steps launched ahead of their read so far.
    steps_ahead: u64,
}

/// A decode step launched ahead of its read: the requests of its rows, in order, and its
/// picks on their way.
struct Ahead {
    ids: Vec<u64>,
    picks: StepPicks,
}

/// Whether decode steps run ahead of their read: `LATTICE_OVERLAP` (`0` or `1`), else on a GPU
/// only (on the CPU the host has no device to wait for).
fn overlap_default(device: &crate::backend::Device) -> bool {
    std::env::var("LATTICE_OVERLAP").map_or(!device.is_cpu(), |v| v != "0")
}

/// `LATTICE_TRACE_STEPS=1` prints, every 64 steps, where the engine's step time went on
/// average: scheduling, the forward pass (with the device's work), taking the output (sampling,
/// streaming, the prefix cache), ending requests.
fn trace_steps() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_TRACE_STEPS").is_ok_and(|v| v != "0"))
}

/// Sums of the engine's step times by part since the last print (`LATTICE_TRACE_STEPS`). A
/// step that reads a step run ahead counts the next step's launch as "schedule" and the wait
/// for the picks as "forward".
#[derive(Default)]
struct StepTrace {
    steps: u32,
    requests: usize,
    /// Seconds: schedule, forward, update, end.
    parts: [f64; 4],
}

impl StepTrace {
    /// Adds a step of `requests` whose parts ended at `marks` (times since the step began).
    fn add(&mut self, requests: usize, marks: [std::time::Duration; 4]) {
        let mut before = 0.0;
        for (part, mark) in self.parts.iter_mut().zip(marks) {
            *part += mark.as_secs_f64() - before;
            before = mark.as_secs_f64();
        }
        self.steps += 1;
        self.requests += requests;
        if self.steps == 64 {
            let [schedule, forward, update, end] = self.parts.map(|t| t / 64.0 * 1e3);
            eprintln!(
                "engine trace: 64 steps of {:.1} requests on average: schedule {schedule:.3} ms, \
                 forward {forward:.3} ms, update {update:.3} ms, end {end:.3} ms",
                self.requests as f64 / 64.0
            );
            *self = Self::default();
        }
    }
}

/// Hands a request's new text and log-probabilities of this step to `on_update` (noting the
/// time of its `first` token), cancelling it when that says so.
fn report(slot: &mut Slot<'_>, first: bool, on_update: &mut dyn FnMut(StepUpdate<'_>) -> bool) {
    if first {
        slot.first_token = Some(Instant::now());
    }
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

/// Whether `slot`, running `n` tokens this step, verifies its draft: its own tokens to run,
/// then the draft.
fn verifies(slot: &Slot<'_>, n: usize) -> bool {
    !slot.draft.is_empty() && n == slot.todo() + slot.draft.len()
}

/// The LoRA adapters each of `slots` picked, one per sequence of a batch in that order; `None`
/// when none picked any.
fn row_adapters<'a, 'm: 'a>(
    slots: impl Iterator<Item = &'a Slot<'m>> + Clone,
) -> Option<Vec<crate::lora::Selection>> {
    let picked = slots.clone().any(|s| !s.seq.request().lora.is_empty());
    picked.then(|| slots.map(|s| s.seq.request().lora.clone()).collect())
}

/// A step's 3-D row positions and image rows (see `BatchEngine::image_rows`).
type ImageStep = (Option<Vec<[usize; 3]>>, Option<InjectedRows>);

/// What a step's forward pass returned (see `BatchEngine::forward`).
enum StepOutput {
    /// Logits f32 [rows, vocab]: of each scheduled request's last row, and of every row of a
    /// request verifying a draft; `rows[k]` = (first row, rows) of scheduled request k.
    Logits {
        logits: Vec<f32>,
        rows: Vec<(usize, usize)>,
    },
    /// The token picked from each scheduled request's last row, where the logits are (by
    /// [`crate::sample::Pick`]s; the plain argmax for requests that do not sample next).
    Picks(Vec<Picked>),
}

impl<'m> BatchEngine<'m> {
    /// An engine that runs at most `max_running` sequences at once, with unbounded memory and
    /// prefix caching.
    pub fn new(model: &'m TextModel, max_running: usize) -> Self {
        Self::with_config(
            model,
            EngineConfig {
                max_running,
                ..EngineConfig::default()
            },
        )
    }

    /// An engine set up by `config`.
    pub fn with_config(model: &'m TextModel, config: EngineConfig) -> Self {
        let memory = KvMemory::new(
            model.memory_layout(),
            model.kv_dtype,
            &config.memory,
            &model.decoder.info().device,
        );
        Self::with_memory(model, config, memory)
    }

    /// An engine over existing memory (a chat session's); `config.memory` is ignored.
    pub fn with_memory(model: &'m TextModel, config: EngineConfig, memory: KvMemory) -> Self {
        // A recurrent model's prompt chunks end at snapshot positions: a smaller step budget
        // could never fit one (the request would wait forever).
        let floor = if memory.layout().is_recurrent() {
            memory.snapshot_every()
        } else {
            1
        };
        Self {
            model,
            scheduler: Scheduler {
                max_running: config.max_running.max(1),
                token_budget: config.prefill_chunk.max(floor),
            },
            memory,
            waiting: VecDeque::new(),
            running: Vec::new(),
            kept: HashMap::new(),
            next_id: 0,
            drafts: model.draft_refusal().is_none(),
            suffix_cache: SuffixCache::new(speculate::SUFFIX_CACHE_TOKENS),
            step_cost: StepCost::default(),
            trace: StepTrace::default(),
            overlap: overlap_default(&model.decoder.info().device),
            overlap_sampled: !std::env::var("LATTICE_OVERLAP_SAMPLED").is_ok_and(|v| v == "0"),
            ahead: None,
            steps_ahead: 0,
        }
    }

    /// Lets decode steps run ahead of their read, or not (see the module comment; the
    /// default depends on the device). A step already launched is still read.
    pub fn set_overlap(&mut self, on: bool) {
        self.overlap = on;
    }

    /// Lets sampled requests run ahead too where steps do, or not (on by default;
    /// `LATTICE_OVERLAP_SAMPLED=0` turns it off; see the module comment).
    pub fn set_overlap_sampled(&mut self, on: bool) {
        self.overlap_sampled = on;
    }

    /// Decode steps launched ahead of their read so far.
    pub fn steps_ahead(&self) -> u64 {
        self.steps_ahead
    }

    /// The engine's memory, for another engine later.
    pub fn into_memory(self) -> KvMemory {
        self.memory
    }

    /// How much memory is in use, and the prefix cache's counters.
    pub fn memory_stats(&self) -> MemoryStats {
        self.memory.stats()
    }

    /// Drops every cached prefix no running request holds.
    pub fn clear_prefix_cache(&mut self) {
        self.memory.clear_cache();
    }

    fn check(&self, req: &GenerateRequest) -> Result<usize> {
        req.sampling.validate()?;
        if let Some(v) = &self.model.vision {
            let placeholders = req
                .prompt_ids
                .iter()
                .filter(|&&t| t == v.image_token_id)
                .count();
            if placeholders > 0 && req.images.is_empty() {
                return Err(Error::InvalidInput(format!(
                    "the prompt has {placeholders} image tokens but no images"
                )));
            }
        }
        if !req.images.is_empty() {
            if self.model.vision.is_none() {
                return Err(Error::InvalidInput(
                    "this model takes no images (it has no vision tower)".into(),
                ));
            }
            let device = &self.model.decoder.info().device;
            if !device.is_cpu() {
                return Err(Error::InvalidInput(format!(
                    "images do not run on {device} yet; use the CPU"
                )));
            }
        }
        if !req.lora.is_empty() {
            match &self.model.lora {
                Some(plan) => plan.check(&req.lora)?,
                None => {
                    return Err(Error::InvalidInput(
                        "the request picks LoRA adapters, but the model was loaded without them"
                            .into(),
                    ))
                }
            }
        }
        let cfg = &self.model.decoder.info().config;
        let context = cfg.max_positions;
        if req.prompt_ids.is_empty() {
            return Err(Error::InvalidInput("the prompt has no tokens".into()));
        }
        if req.prompt_ids.len() >= context {
            return Err(Error::InvalidInput(format!(
                "the prompt has {} tokens; the context holds {context}",
                req.prompt_ids.len()
            )));
        }
        let vocab = cfg.vocab_size;
        if let Some(bad) = req.prompt_ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {vocab} tokens"
            )));
        }
        let max_len = req
            .prompt_ids
            .len()
            .saturating_add(req.max_tokens.max(1))
            .min(context);
        // A sequence that could never fit in the memory budget on its own is refused now.
        let stats = self.memory.stats();
        let need = self.memory.sequence_bytes(max_len);
        if need > stats.budget_bytes {
            return Err(Error::InvalidInput(format!(
                "the request needs up to {max_len} tokens of KV memory ({need} bytes); the budget is {} bytes (--kv-cache-memory)",
                stats.budget_bytes
            )));
        }
        Ok(max_len)
    }

    /// Queues a request; returns its id. Invalid requests are refused here.
    pub fn submit(&mut self, req: GenerateRequest) -> Result<u64> {
        let max_len = self.check(&req)?;
        let id = self.next_id;
        self.next_id += 1;
        let images = self.prompt_images(&req)?;
        let seq = Sequence::new(self.model, req, 0);
        let mut slot = Slot::new(id, seq, max_len);
        slot.images = images;
        self.waiting.push_back(slot);
        Ok(id)
    }

    /// Queues a request that continues `state`, which already holds the first `state.len()`
    /// prompt tokens (made from this engine's memory); when it ends, the state is kept for
    /// [`BatchEngine::take_state`] (with, for recurrent models, a copy at the end of the
    /// prompt).
    pub fn submit_with_state(&mut self, req: GenerateRequest, state: SeqState) -> Result<u64> {
        self.check(&req)?;
        if state.len() >= req.prompt_ids.len() {
            return Err(Error::InvalidInput(
                "the state must hold less than the whole prompt".into(),
            ));
        }
        let id = self.next_id;
        self.next_id += 1;
        let cached = state.len();
        let images = self.prompt_images(&req)?;
        let seq = Sequence::new(self.model, req, cached);
        let mut slot = Slot::new(id, seq, state.max_len());
        slot.images = images;
        slot.computed = cached;
        slot.state = Some(state);
        slot.keep_state = true;
        slot.started = Some(Instant::now());
        self.waiting.push_back(slot);
        Ok(id)
    }

    /// The plan of a request's images (positions, placeholder rows, cache key), if it has any.
    fn prompt_images(&self, req: &GenerateRequest) -> Result<Option<Box<PromptImages>>> {
        match (&self.model.vision, req.images.is_empty()) {
            (Some(v), false) => Ok(Some(Box::new(PromptImages::new(
                v,
                &req.prompt_ids,
                req.images.clone(),
            )?))),
            _ => Ok(None),
        }
    }

    /// The state of a request submitted with [`BatchEngine::submit_with_state`] once it ended.
    pub fn take_state(&mut self, id: u64) -> Option<KeptState> {
        self.kept.remove(&id)
    }

    /// Requests queued or running.
    pub fn pending(&self) -> usize {
        self.waiting.len() + self.running.len()
    }

    /// Requests queued, not yet admitted (preempted ones included).
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
        let slot = if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            self.waiting.remove(i)?
        } else {
            let i = self.running.iter().position(|s| s.id == id)?;
            self.running.remove(i)
        };
        let mut out = slot.seq.into_generation();
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
        if let Some(ahead) = self.ahead.take() {
            return self.step_ahead(ahead, on_update);
        }
        let t0 = Instant::now();
        self.plan_drafts();
        let schedule =
            self.scheduler
                .schedule(&mut self.waiting, &mut self.running, &mut self.memory)?;
        let scheduled = t0.elapsed();
        let mut forwarded = scheduled;
        if !schedule.work.is_empty() {
            if schedule.work.len() == self.running.len()
                && schedule.work.iter().all(|&(_, n)| n == 1)
                && self.can_run_ahead(0)
            {
                let ids = self.running.iter().map(|s| s.id).collect();
                if let Some(picks) = self.launch_ahead(None)? {
                    self.ahead = Some(Ahead { ids, picks });
                    return Ok(Vec::new());
                }
            }
            let start = Instant::now();
            let output = self.forward(&schedule)?;
            let rows = schedule.work.iter().map(|&(_, n)| n).sum();
            self.step_cost.record(rows, start.elapsed().as_secs_f64());
            forwarded = t0.elapsed();
            self.update_from_output(&schedule, &output, on_update);
        }
        let updated = t0.elapsed();
        let ended = self.reap();
        if trace_steps() {
            self.trace.add(
                schedule.work.len(),
                [scheduled, forwarded, updated, t0.elapsed()],
            );
        }
        Ok(ended)
    }

    /// The step after a decode step launched ahead: launches the next one where it may (its
    /// tokens that step's picks), then reads that step's picks and takes them as
    /// [`BatchEngine::step_with`] takes a step's output (requests cancelled since have no
    /// row any more).
    fn step_ahead(
        &mut self,
        ahead: Ahead,
        on_update: &mut dyn FnMut(StepUpdate<'_>) -> bool,
    ) -> Result<Vec<(u64, Generation)>> {
        let t0 = Instant::now();
        let same = self.running.len() == ahead.ids.len()
            && self
                .running
                .iter()
                .zip(&ahead.ids)
                .all(|(s, &id)| s.id == id);
        let next = if same && self.can_run_ahead(1) {
            self.launch_ahead(Some(&ahead.picks))
        } else {
            Ok(None)
        };
        let launched = t0.elapsed();
        let read = crate::ops::read_step(&self.model.decoder.info().device, ahead.picks);
        let (next, picks) = (next?, read?);
        let read = t0.elapsed();
        let mut work = Vec::with_capacity(picks.len());
        let mut picked = Vec::with_capacity(picks.len());
        let mut at = 0;
        for (&id, p) in ahead.ids.iter().zip(picks) {
            if let Some(k) = self.running[at..].iter().position(|s| s.id == id) {
                at += k;
                let slot = &mut self.running[at];
                if slot.seq.take_void() {
                    // Its draw was void (the pick before drew nothing and rewound the random
                    // stream): the row's keys and values stand, but its pick is made again,
                    // by running the row again.
                    let state = slot.state.as_mut().expect("running slots have state");
                    state.truncate(slot.computed);
                } else {
                    work.push((at, 1));
                    picked.push(p);
                }
                at += 1;
            }
        }
        let rows = work.len();
        self.update_from_output(&Schedule { work }, &StepOutput::Picks(picked), on_update);
        self.ahead = next.map(|picks| Ahead {
            ids: ahead.ids,
            picks,
        });
        let updated = t0.elapsed();
        let ended = self.reap();
        if trace_steps() {
            self.trace
                .add(rows, [launched, read, updated, t0.elapsed()]);
        }
        Ok(ended)
    }

    /// Whether the next decode step may run ahead of its read, `in_flight` steps being
    /// launched and not read: overlap on, no request waiting that could join (none waits, or
    /// every slot is taken: one frees only when a request ends), every running request
    /// decoding its one token with its choice made on the device and nothing the host must see
    /// first (an output constraint, log-probabilities, drafts, images, a state to keep), with
    /// room for one more row, and either picking the argmax or (when sampled requests may run
    /// ahead) sampling without penalties (which would need the token not read yet) with a
    /// state that can drop its last row (a sampled step whose draw turns out void runs again:
    /// see `step_ahead`); and one of them at least still generating after the steps in
    /// flight.
    fn can_run_ahead(&self, in_flight: usize) -> bool {
        self.overlap
            && (self.waiting.is_empty() || self.running.len() >= self.scheduler.max_running)
            && !self.running.is_empty()
            && self.running.len() <= REPLAYED_ROWS
            && self.running.iter().all(|s| {
                let req = s.seq.request();
                s.state.is_some()
                    && !s.cancelled
                    && !s.finished()
                    && !s.keep_state
                    && s.images.is_none()
                    && s.draft.is_empty()
                    && req.draft_tokens == 0
                    && s.seq.can_plan()
                    && !s.seq.has_void_plan()
                    && (s.seq.picks_argmax()
                        || self.overlap_sampled && s.seq.plans_ahead() && s.truncates())
                    && s.todo() == 1
                    && s.computed + 1 + in_flight <= s.max_len
            })
            && self.running.iter().any(|s| {
                s.seq.generation().token_ids.len() + in_flight < s.seq.request().max_tokens
            })
    }

    /// Launches a decode step of every running request (one token each, picked on the device:
    /// the argmax, or the request's planned choice) without reading its picks. With `after`
    /// (the step launched before, of the same requests, not read yet), its tokens are that
    /// step's picks and its rows' memory is reserved here; `None` when the device cannot take
    /// them from there ([`Decoder::can_follow`]) or the memory is spent (the step then waits
    /// for the read and the scheduler). Choices are planned only once the step launches.
    ///
    /// [`Decoder::can_follow`]: crate::model::decoder::Decoder::can_follow
    fn launch_ahead(&mut self, after: Option<&StepPicks>) -> Result<Option<StepPicks>> {
        let n = self.running.len();
        let (ids, follows): (Vec<u32>, bool) = match after.map(StepPicks::ready) {
            None => (
                self.running
                    .iter()
                    .map(|s| s.seq.history()[s.computed])
                    .collect(),
                false,
            ),
            Some(Some(picked)) => (picked.iter().map(|p| p.token).collect(), false),
            Some(None) => (vec![0; n], true),
        };
        let lens = vec![1; n];
        let sampling = !self.running.iter().all(|s| s.seq.picks_argmax());
        let mut batch = ForwardBatch::tokens(&ids, &lens, RowOutputs::LastLogits);
        batch.adapters = row_adapters(self.running.iter());
        if follows && !self.model.decoder.can_follow(&batch, sampling) {
            return Ok(None);
        }
        if after.is_some() {
            for slot in &mut self.running {
                let state = slot.state.as_mut().expect("running slots have state");
                match self.memory.reserve(state, 1) {
                    Ok(()) => {}
                    Err(Error::OutOfMemory(_)) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        }
        // (Planned last: a plan's draw is settled by the pick it makes.)
        let picks: Vec<Pick> = self
            .running
            .iter_mut()
            .map(|s| {
                if s.seq.picks_argmax() {
                    Pick::argmax()
                } else {
                    s.seq.plan()
                }
            })
            .collect();
        let mut states: Vec<&mut SeqState> = self
            .running
            .iter_mut()
            .map(|s| s.state.as_mut().expect("running slots have state"))
            .collect();
        let picks = self
            .model
            .decoder
            .launch_pick(&batch, &mut states, &picks, follows)?;
        self.steps_ahead += 1;
        Ok(Some(picks))
    }

    /// Drafts for this step (speculative decoding, see `speculate.rs`): every running request
    /// past its prompt that asked for them drafts up to its current draft length (by prompt
    /// lookup or suffix match) and no more than pays at this step's size ([`StepCost`]),
    /// within its token and context limits, so that its tokens to run and the draft stay
    /// within [`ROW_BY_ROW`] rows; the draft is cut to what its output constraint allows, and
    /// a recurrent state keeps its state before the pass (the rollback of a rejected draft).
    /// Waiting requests hold no draft.
    fn plan_drafts(&mut self) {
        for slot in &mut self.waiting {
            slot.draft.clear();
        }
        if !self.drafts {
            return;
        }
        // The step's rows without drafts: prompt chunks, and every other request's tokens.
        let chunk = self.scheduler.token_budget;
        let rows: usize = self
            .running
            .iter()
            .map(|s| {
                let prefilling = s.computed < s.seq.request().prompt_ids.len();
                s.todo().min(if prefilling { chunk } else { ROW_BY_ROW })
            })
            .sum();
        let threshold = self.step_cost.threshold(rows);
        for slot in &mut self.running {
            slot.draft.clear();
            let req = slot.seq.request();
            let todo = slot.todo();
            if req.draft_tokens == 0
                || slot.state.is_none()
                || todo == 0
                || todo >= ROW_BY_ROW
                || slot.computed < req.prompt_ids.len()
                || slot.finished()
                || slot.cancelled
            {
                continue;
            }
            let generated = slot.seq.generation().token_ids.len();
            let cap = (req.max_tokens.saturating_sub(generated + 1))
                .min(slot.max_len.saturating_sub(slot.computed + todo))
                .min(ROW_BY_ROW - todo);
            let len = slot
                .draft_len
                .next()
                .min(cap)
                .min(slot.draft_len.paying(threshold));
            let mut draft = match req.drafter {
                Drafter::Ngram => speculate::ngram_draft(slot.seq.history(), len),
                Drafter::Suffix => {
                    let history = slot.seq.history();
                    slot.suffix.extend(&history[slot.suffix.len()..]);
                    suffix_draft(&slot.suffix, Some(&self.suffix_cache), len)
                }
            };
            slot.seq.trim_draft(&mut draft);
            let state = slot.state.as_mut().expect("checked above");
            if !draft.is_empty() && state.keep_previous().is_ok() {
                slot.draft = draft;
            }
        }
    }

    /// Whether scheduled request `i` running `n` tokens verifies its draft this step.
    fn verifies(&self, i: usize, n: usize) -> bool {
        verifies(&self.running[i], n)
    }

    /// One forward pass over the scheduled tokens of every request in `schedule`: the picked
    /// tokens themselves when no request verifies a draft or needs its logits on the host (an
    /// output constraint, log-probabilities): the model picks them where the logits are, so a
    /// GPU sends back ids, not logits. Else the logits (every row of a request that verifies a
    /// draft).
    fn forward(&mut self, schedule: &Schedule) -> Result<StepOutput> {
        let (positions, injected) = self.image_rows(schedule)?;
        let drafts = schedule.work.iter().any(|&(i, n)| self.verifies(i, n));
        // Requests that sample after this step plan their choice; the others' picks are not
        // used (their prompts continue), so they take the plain argmax.
        let samples = |slot: &Slot<'m>, n: usize| {
            slot.computed + n >= slot.seq.history().len() && !slot.finished()
        };
        let device_picks = !drafts
            && schedule.work.iter().all(|&(i, n)| {
                let slot = &self.running[i];
                !samples(slot, n) || slot.seq.can_plan()
            });
        let picks: Option<Vec<Pick>> = device_picks.then(|| {
            schedule
                .work
                .iter()
                .map(|&(i, n)| {
                    let slot = &mut self.running[i];
                    if samples(slot, n) && !slot.seq.picks_argmax() {
                        slot.seq.plan()
                    } else {
                        Pick::argmax()
                    }
                })
                .collect()
        });
        let mut ids = Vec::new();
        let mut lens = Vec::with_capacity(schedule.work.len());
        let mut flags = Vec::new();
        let mut rows = Vec::with_capacity(schedule.work.len());
        for &(i, n) in &schedule.work {
            let slot = &self.running[i];
            // A draft follows the request's own tokens; the logits of its last own row and of
            // every draft row are kept.
            let draft: &[u32] = if self.verifies(i, n) {
                &slot.draft
            } else {
                &[]
            };
            let own = n - draft.len();
            ids.extend_from_slice(&slot.seq.history()[slot.computed..slot.computed + own]);
            ids.extend_from_slice(draft);
            lens.push(n);
            let out = 1 + draft.len();
            rows.push((rows.last().map_or(0, |&(a, b)| a + b), out));
            flags.extend((0..n).map(|r| r + out >= n));
        }
        let adapters = row_adapters(schedule.work.iter().map(|&(i, _)| &self.running[i]));
        let mut next = schedule.work.iter().map(|&(i, _)| i).peekable();
        let mut states: Vec<&mut SeqState> = Vec::with_capacity(lens.len());
        for (i, slot) in self.running.iter_mut().enumerate() {
            if next.peek() == Some(&i) {
                next.next();
                states.push(slot.state.as_mut().expect("scheduled slots have state"));
            }
        }
        let outputs = if drafts {
            RowOutputs::Logits(flags)
        } else {
            RowOutputs::LastLogits
        };
        let mut batch = ForwardBatch::tokens(&ids, &lens, outputs);
        batch.adapters = adapters;
        if let Some(p) = positions {
            batch.positions = Positions::Rope3d(p);
        }
        batch.injected = injected;
        Ok(if let Some(picks) = picks {
            StepOutput::Picks(
                self.model
                    .decoder
                    .forward_pick(&batch, &mut states, &picks)?,
            )
        } else {
            StepOutput::Logits {
                logits: self.model.decoder.forward_batch(&batch, &mut states)?,
                rows,
            }
        })
    }

    /// A step with images in it: the 3-D position of every row and the image rows of this
    /// step's prompt chunks (their images encoded when first needed). `(None, None)` when no
    /// scheduled request has images.
    fn image_rows(&mut self, schedule: &Schedule) -> Result<ImageStep> {
        let Some(vision) = &self.model.vision else {
            return Ok((None, None));
        };
        if !schedule
            .work
            .iter()
            .any(|&(i, _)| self.running[i].images.is_some())
        {
            return Ok((None, None));
        }
        let mut positions = Vec::new();
        let mut injected = InjectedRows::default();
        let mut at = 0;
        for &(i, n) in &schedule.work {
            let slot = &mut self.running[i];
            let from = slot.computed;
            match slot.images.as_mut() {
                Some(m) => {
                    positions.extend((from..from + n).map(|idx| m.position(idx)));
                    m.inject(vision, from, from + n, at, &mut injected)?;
                }
                None => positions.extend((from..from + n).map(|idx| [idx; 3])),
            }
            at += n;
        }
        let injected = (!injected.rows.is_empty()).then_some(injected);
        Ok((Some(positions), injected))
    }

    /// Takes the step's output: advances each request's computed tokens, keeps finished pages
    /// (and recurrent snapshots at the prompt's snapshot positions) in the prefix cache, and samples the next
    /// token of every request whose history is now all computed.
    fn update_from_output(
        &mut self,
        schedule: &Schedule,
        output: &StepOutput,
        on_update: &mut dyn FnMut(StepUpdate<'_>) -> bool,
    ) {
        let p = self.memory.page_rows();
        let recurrent = self.memory.layout().is_recurrent();
        let mut picks = self.pick_in_parallel(schedule, output);
        let verifying: Vec<bool> = schedule
            .work
            .iter()
            .map(|&(i, n)| self.verifies(i, n))
            .collect();
        let vocab = self.model.decoder.info().config.vocab_size;
        for (row, &(i, n)) in schedule.work.iter().enumerate() {
            let slot = &mut self.running[i];
            if verifying[row] {
                // The draft: keep its tokens while the model picks them itself (greedy) or
                // keeps them by the rejection rule (sampling), then the model's own token
                // after them; forget the keys and values of the rest.
                let StepOutput::Logits { logits, rows } = output else {
                    unreachable!("a step with drafts returns logits");
                };
                let first = slot.first_token.is_none();
                let draft = std::mem::take(&mut slot.draft);
                let before = slot.computed;
                let own = n - draft.len();
                let argmax = slot.seq.picks_argmax();
                let mut kept = 0;
                for r in 0..=draft.len() {
                    let at = (rows[row].0 + r) * vocab;
                    let row_logits = &logits[at..at + vocab];
                    let room = before + own + r < slot.max_len;
                    let proposed = draft.get(r).copied();
                    let (more, hit) = if argmax {
                        let t = crate::sample::processors::argmax(row_logits) as u32;
                        let more = slot.seq.accept_token(t, room, &mut |_| true).is_some();
                        (more, proposed == Some(t))
                    } else {
                        let (pick, hit) = match proposed {
                            Some(d) => slot
                                .seq
                                .pick_draft(row_logits, d)
                                .map_or((None, false), |(t, h)| (Some(t), h)),
                            None => (slot.seq.pick(row_logits), false),
                        };
                        (
                            slot.seq.accept_pick(pick, room, &mut |_| true).is_some(),
                            hit,
                        )
                    };
                    kept += usize::from(hit);
                    if !more || !hit {
                        break;
                    }
                }
                slot.computed = before + own + kept;
                let state = slot.state.as_mut().expect("scheduled slots have state");
                if state.can_truncate_to(slot.computed) {
                    state.truncate(slot.computed);
                } else {
                    // A recurrent state goes back to where the pass started (it kept that
                    // state); the request's kept tokens run again in its next step.
                    state.truncate(before);
                    slot.computed = before;
                }
                slot.seq.count_draft(draft.len(), kept);
                slot.draft_len.update(draft.len(), kept);
                if self.memory.caches_prefixes() {
                    let keyed = slot.images.as_ref().map(|m| m.key(slot.seq.history()));
                    let history = &keyed.as_deref().unwrap_or(slot.seq.history())[..slot.computed];
                    let salt = slot.seq.request().lora.key();
                    self.memory.publish(
                        history,
                        state,
                        &mut slot.hashes,
                        &mut slot.published,
                        salt,
                    );
                }
                report(slot, first, on_update);
                continue;
            }
            slot.computed += n;
            let prompt_len = slot.seq.request().prompt_ids.len();
            let state = slot.state.as_ref().expect("scheduled slots have state");
            if self.memory.caches_prefixes() {
                let keyed = slot.images.as_ref().map(|m| m.key(slot.seq.history()));
                let history = &keyed.as_deref().unwrap_or(slot.seq.history())[..slot.computed];
                let salt = slot.seq.request().lora.key();
                self.memory
                    .publish(history, state, &mut slot.hashes, &mut slot.published, salt);
                // Recurrent models: the state at every snapshot position of the prompt
                // (see `Scheduler`), so later prompts sharing it resume there.
                let every = self.memory.snapshot_every();
                let at = slot.computed;
                if recurrent && at > 0 && at <= prompt_len && at.is_multiple_of(every) {
                    let pages = at / p;
                    if !self.memory.has_snapshot(&slot.hashes, pages) {
                        if let Some(s) = self.memory.snapshot(state) {
                            self.memory.publish_snapshot(&slot.hashes, pages, s);
                        }
                    }
                }
            }
            if slot.keep_state && recurrent && slot.computed == prompt_len {
                slot.checkpoint = Some(state.clone());
            }
            if slot.todo() > 0 || slot.finished() {
                continue; // more to run before sampling, or only the prompt was asked for
            }
            let room = slot.computed < slot.max_len;
            let first = slot.first_token.is_none();
            match output {
                StepOutput::Logits { logits, rows } => match picks[row].take() {
                    Some(pick) => slot.seq.accept_pick(pick, room, &mut |_| true),
                    None => {
                        let at = (rows[row].0 + rows[row].1 - 1) * vocab;
                        slot.seq
                            .accept(&logits[at..at + vocab], room, &mut |_| true)
                    }
                },
                StepOutput::Picks(picked) => {
                    slot.seq.accept_picked(picked[row], room, &mut |_| true)
                }
            };
            report(slot, first, on_update);
        }
    }

    /// The choices ([`Sequence::pick`]: constraint masks, sampling, log-probabilities) of
    /// every row of the step that samples next, made for all of them at once on the thread pool;
    /// they are independent per sequence and each can take a fraction of a millisecond over a
    /// large vocabulary. `None` for the other rows (and for a step with one such row).
    fn pick_in_parallel(
        &mut self,
        schedule: &Schedule,
        output: &StepOutput,
    ) -> Vec<Option<Option<u32>>> {
        let mut picks = vec![None; schedule.work.len()];
        let StepOutput::Logits { logits, rows } = output else {
            return picks;
        };
        let vocab = self.model.decoder.info().config.vocab_size;
        let mut jobs: Vec<(usize, &mut Sequence<'m>)> = Vec::new();
        let mut next = schedule.work.iter().enumerate().peekable();
        for (i, slot) in self.running.iter_mut().enumerate() {
            let Some(&(row, &(at, n))) = next.peek() else {
                break;
            };
            if at != i {
                continue;
            }
            next.next();
            if !verifies(slot, n)
                && slot.computed + n >= slot.seq.history().len()
                && !slot.finished()
            {
                jobs.push((row, &mut slot.seq));
            }
        }
        if jobs.len() < 2 {
            return picks;
        }
        let out = crate::ops::par_map_mut(&mut jobs, true, |(row, seq)| {
            let at = (rows[*row].0 + rows[*row].1 - 1) * vocab;
            seq.pick(&logits[at..at + vocab])
        });
        for ((row, _), p) in jobs.iter().zip(out) {
            picks[*row] = Some(p);
        }
        picks
    }

    /// Removes the requests that ended (their pages stay in the prefix cache), keeping their
    /// state when asked.
    fn reap(&mut self) -> Vec<(u64, Generation)> {
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            let slot = &self.running[i];
            if !(slot.finished() || slot.cancelled) {
                i += 1;
                continue;
            }
            let mut slot = self.running.remove(i);
            let ended = slot.finished();
            let now = Instant::now();
            let started = slot.started.unwrap_or(now);
            let first = slot.first_token.unwrap_or(now);
            slot.seq
                .set_timing((first - started).as_secs_f64(), (now - first).as_secs_f64());
            if slot.keep_state {
                if let Some(state) = slot.state.take() {
                    self.kept.insert(
                        slot.id,
                        KeptState {
                            state,
                            checkpoint: slot.checkpoint.take(),
                        },
                    );
                }
            }
            let req = slot.seq.request();
            if req.draft_tokens > 0 && req.drafter == Drafter::Suffix {
                self.suffix_cache
                    .insert(&slot.seq.history()[req.prompt_ids.len()..]);
            }
            let mut out = slot.seq.into_generation();
            if slot.cancelled && !ended {
                out.finish_reason = FinishReason::Cancelled;
            }
            finished.push((slot.id, out));
        }
        finished
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
