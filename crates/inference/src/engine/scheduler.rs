//! The scheduler: which requests run in the next step and how many of their tokens, within the
//! step's token budget, the running-sequence limit and the memory budget (vLLM's `schedule()`).
//! Every kind of work is a token count over a request's [`Slot`]: a prompt chunk, a prompt
//! prefix found in the prefix cache (skipped: its tokens count as computed), the one token of a
//! decode step and its speculative draft, the tokens of a preempted request being recomputed.
//!
//! Admission takes waiting requests while they fit (a state, the pages of their first chunk);
//! a running request that cannot get pages for its tokens first evicts unused cached pages,
//! then preempts the most recently admitted running request (its state is dropped and
//! recomputed when it is admitted again: the prompt in chunks, the generated tokens one per
//! step as they first ran; its sampler and output so far are kept, so its output is unchanged).

use std::collections::VecDeque;
use std::time::Instant;

use crate::attention::ROW_BY_ROW;
use crate::state::SeqState;
use crate::{Error, Result};

use super::memory::KvMemory;
use super::sequence::Sequence;

/// One request in the engine, waiting or running.
pub(crate) struct Slot<'m> {
    pub id: u64,
    pub seq: Sequence<'m>,
    /// Its memory while admitted (`None` while waiting, also after a preemption).
    pub state: Option<SeqState>,
    /// Tokens of `seq.history()` whose keys and values are in `state`.
    pub computed: usize,
    /// Most tokens the state may hold.
    pub max_len: usize,
    /// Chained page hashes of the history (prefix cache).
    pub hashes: Vec<u64>,
    /// Full pages already handed to the prefix cache.
    pub published: usize,
    /// Bytes of text and log-probability entries already streamed.
    pub sent_text: usize,
    pub sent_logprobs: usize,
    /// The caller asked to stop this request.
    pub cancelled: bool,
    /// Hand the state back when the request ends (a chat session keeps it).
    pub keep_state: bool,
    /// With `keep_state` on a recurrent model: the state at the end of the prompt.
    pub checkpoint: Option<SeqState>,
    /// When it was first admitted (its cached prompt tokens are counted then only), and
    /// when it sampled its first token.
    pub started: Option<Instant>,
    pub first_token: Option<Instant>,
    /// Tokens drafted to follow the last one this step (verified with it), and how many the
    /// next draft may take.
    pub draft: Vec<u32>,
    pub draft_len: super::speculate::DraftLength,
    /// The history indexed for suffix drafts (filled as they are made).
    pub suffix: super::suffix::SuffixIndex,
    /// The images of its prompt, if any.
    pub images: Option<Box<super::multimodal::PromptImages>>,
}

impl<'m> Slot<'m> {
    pub fn new(id: u64, seq: Sequence<'m>, max_len: usize) -> Self {
        let draft_len = super::speculate::DraftLength::new(seq.request().draft_tokens);
        Self {
            draft: Vec::new(),
            draft_len,
            suffix: super::suffix::SuffixIndex::new(),
            id,
            seq,
            state: None,
            computed: 0,
            max_len,
            hashes: Vec::new(),
            published: 0,
            sent_text: 0,
            sent_logprobs: 0,
            cancelled: false,
            keep_state: false,
            checkpoint: None,
            started: None,
            first_token: None,
            images: None,
        }
    }

    /// The first `upto` tokens of the history as the prefix cache keys them (image tokens
    /// by their image's content).
    pub fn cache_key(&self, upto: usize) -> std::borrow::Cow<'_, [u32]> {
        let history = &self.seq.history()[..upto];
        match &self.images {
            Some(m) => m.key(history),
            None => std::borrow::Cow::Borrowed(history),
        }
    }

    fn prompt_len(&self) -> usize {
        self.seq.request().prompt_ids.len()
    }

    /// Tokens of the history not yet in the state.
    pub fn todo(&self) -> usize {
        self.seq.history().len() - self.computed
    }

    /// Whether the request has nothing more to run: it ended, or it only asked for the
    /// prompt to be run (`max_tokens == 0`) and that is done.
    pub fn finished(&self) -> bool {
        self.seq.is_done()
            || (self.seq.request().max_tokens == 0 && self.computed >= self.prompt_len())
    }

    /// Whether its state can drop its last row (attention only; a recurrent state cannot go
    /// back).
    pub fn truncates(&self) -> bool {
        self.state
            .as_ref()
            .is_some_and(|s| s.can_truncate_to(s.len().saturating_sub(1)))
    }

    /// Whether it is still running its prompt.
    fn prefilling(&self) -> bool {
        self.computed < self.prompt_len()
    }
}

/// What the next step runs: `(index into the running list, tokens)`, in running order.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    pub work: Vec<(usize, usize)>,
}

/// The scheduling policy's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scheduler {
    /// Most requests admitted at once.
    pub max_running: usize,
    /// Most prompt (or recomputed) tokens per step; decode tokens come on top.
    pub token_budget: usize,
}

impl Scheduler {
    /// Decides the next step: admits waiting requests, gives every running request its token
    /// count, and finds the memory for all of it (evicting, then preempting). `waiting` and
    /// `running` are updated in place (admitted and preempted requests move between them).
    pub fn schedule<'m>(
        &self,
        waiting: &mut VecDeque<Slot<'m>>,
        running: &mut Vec<Slot<'m>>,
        memory: &mut KvMemory,
    ) -> Result<Schedule> {
        let mut work = Vec::new();
        let mut budget = self.token_budget;
        let mut i = 0;
        while i < running.len() {
            let slot = &running[i];
            if slot.finished() || slot.cancelled {
                i += 1;
                continue;
            }
            let Some(n) = self.tokens_for(slot, &mut budget, memory) else {
                i += 1;
                continue;
            };
            // Memory for the tokens: evict, else preempt the newest other request.
            loop {
                let state = running[i].state.as_mut().expect("running slots have state");
                match memory.reserve(state, n) {
                    Ok(()) => {
                        work.push((i, n));
                        break;
                    }
                    Err(Error::OutOfMemory(m)) => {
                        let victim = running.len() - 1;
                        let alone = victim == i;
                        if alone && work.is_empty() && waiting.is_empty() {
                            // Nothing else holds memory: this request cannot run at all.
                            return Err(Error::OutOfMemory(format!(
                                "{m}; a single sequence of {} tokens does not fit (raise the KV memory budget)",
                                running[i].computed + n
                            )));
                        }
                        preempt(running.remove(victim), waiting, memory);
                        if alone {
                            break;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            i += 1;
        }
        // Admit waiting requests while they fit.
        let mut w = 0;
        while running.len() < self.max_running && w < waiting.len() {
            if budget == 0 {
                break;
            }
            if self.defer(&waiting[w], running, memory) {
                w += 1;
                continue;
            }
            let mut slot = waiting.remove(w).expect("index checked");
            match admit(&mut slot, memory) {
                Ok(()) => {}
                Err(Error::OutOfMemory(_)) => {
                    waiting.insert(w, slot);
                    break;
                }
                Err(e) => return Err(e),
            }
            let Some(n) = self.tokens_for(&slot, &mut budget, memory) else {
                running.push(slot);
                continue;
            };
            let state = slot.state.as_mut().expect("admitted");
            match memory.reserve(state, n) {
                Ok(()) => {
                    running.push(slot);
                    work.push((running.len() - 1, n));
                }
                Err(Error::OutOfMemory(_)) => {
                    // Not now: give its memory back and let it wait at the front.
                    slot.state = None;
                    slot.computed = 0;
                    waiting.insert(w, slot);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Schedule { work })
    }

    /// The tokens `slot` runs in the next step: its decode token, or a prompt chunk within
    /// `budget` (for recurrent models, ending at a snapshot position). `None` when it runs
    /// nothing this step.
    fn tokens_for(&self, slot: &Slot<'_>, budget: &mut usize, memory: &KvMemory) -> Option<usize> {
        let todo = slot.todo();
        if todo == 0 {
            return None;
        }
        if !slot.prefilling() {
            // Past the prompt: the decode token and its draft, or a few tokens to run again
            // (kept draft tokens of a recurrent model whose pass was undone; a preempted
            // request's generated tokens). At most `ROW_BY_ROW` at once: such rows compute
            // what decode steps compute, bit for bit (attention row by row, the delta rule
            // token by token), where a prompt-style pass rounds differently, so the output
            // does not change.
            let n = todo.min(ROW_BY_ROW);
            return Some(if n == todo { n + slot.draft.len() } else { n });
        }
        let mut n = todo.min(*budget);
        if memory.layout().is_recurrent() {
            // A recurrent model's prompt runs in chunks that end at fixed positions (multiples
            // of `snapshot_every`, or the prompt's end), cache or not, batch or not: the
            // chunked delta rule computes 64-token sub-chunks from each chunk's start, so with
            // aligned ends a request computes the same numbers alone, in a batch, with the
            // cache off, and when it resumes from a snapshot kept at one of those positions.
            // A chunk that does not fit in what is left of the step's budget waits a step.
            let every = memory.snapshot_every();
            let end = ((slot.computed / every + 1) * every).min(slot.prompt_len());
            n = end - slot.computed;
            if n > *budget {
                return None;
            }
        }
        if n == 0 {
            return None;
        }
        *budget -= n;
        Some(n)
    }

    /// Whether a waiting request should wait for a running one that is still computing the
    /// same first page of prompt: once that one's pages are cached, this one reuses them
    /// (the `n` choices of one request, clients sharing a system prompt).
    fn defer(&self, slot: &Slot<'_>, running: &[Slot<'_>], memory: &KvMemory) -> bool {
        let p = memory.page_rows();
        // Recurrent models reuse a prefix only from a snapshot position: a shorter prompt has
        // nothing to gain from waiting.
        let reusable = if memory.layout().is_recurrent() {
            memory.snapshot_every()
        } else {
            p
        };
        let prompt_len = slot.prompt_len();
        memory.caches_prefixes()
            && prompt_len > reusable
            && running.iter().any(|r| {
                r.prefilling()
                    && !r.finished()
                    && r.prompt_len() >= p
                    && r.cache_key(p) == slot.cache_key(p)
            })
    }
}

/// Gives a waiting request its state: from the prefix cache when its history starts with
/// cached pages, else empty.
fn admit(slot: &mut Slot<'_>, memory: &mut KvMemory) -> Result<()> {
    if slot.state.is_some() {
        return Ok(()); // a session's own state
    }
    let mut state = memory.new_state(slot.max_len)?;
    let history = slot.cache_key(slot.seq.history().len());
    // Always run at least the last token (its logits pick the next one).
    // Keys and values depend on the request's adapters: their prefixes are cached apart.
    let hit = memory.lookup(&history, history.len() - 1, slot.seq.request().lora.key());
    let reused = hit.tokens;
    if reused > 0 {
        state.adopt_prefix(hit.pages, reused, hit.snapshot.as_deref())?;
    }
    slot.computed = reused;
    slot.state = Some(state);
    if slot.started.is_none() {
        slot.seq
            .set_cached_prompt_tokens(reused.min(slot.prompt_len()));
        slot.started = Some(Instant::now());
    }
    Ok(())
}

/// Drops a running request's state (its cached pages stay cached) and puts it back at the
/// front of the queue; it recomputes its history when admitted again.
fn preempt<'m>(mut slot: Slot<'m>, waiting: &mut VecDeque<Slot<'m>>, memory: &mut KvMemory) {
    slot.state = None;
    slot.computed = 0;
    slot.checkpoint = None;
    memory.preemptions += 1;
    waiting.push_front(slot);
}
