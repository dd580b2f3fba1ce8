//! One request start to finish, as a batch of one through [`BatchEngine`]: [`generate`] in a
//! fresh sequence, [`generate_in`] continuing a chat [`Session`].

use crate::Result;

use super::batch::{BatchEngine, EngineConfig};
use super::memory::{KvMemory, MemoryConfig};
use super::request::{GenerateRequest, Generation};
use super::TextModel;
use crate::state::SeqState;

/// A sequence kept across requests (a chat): its state and the tokens in it. A new request
/// whose prompt starts with tokens already in the state only runs the rest (to the token, not
/// only whole pages as the engine's prefix cache does).
#[derive(Debug)]
pub struct Session {
    memory: Option<KvMemory>,
    cache: Option<SeqState>,
    ids: Vec<u32>,
    max_len: usize,
    /// For states that cannot be rewound (recurrent layers): a snapshot taken at the end of the
    /// last prompt, before generation, and how many tokens it holds. The next turn's prompt
    /// usually extends that prompt, so it restarts from here instead of from nothing.
    checkpoint: Option<(usize, SeqState)>,
}

impl Session {
    /// An empty session for `model`, holding up to `max_len` tokens (capped at its context).
    pub fn new(model: &TextModel, max_len: usize) -> Self {
        let memory = KvMemory::new(
            model.memory_layout(),
            model.kv_dtype,
            &MemoryConfig {
                prefix_cache: false,
                ..MemoryConfig::default()
            },
            &model.decoder.info().device,
        );
        Self {
            memory: Some(memory),
            max_len: max_len.min(model.decoder.info().config.max_positions),
            cache: None,
            ids: Vec::new(),
            checkpoint: None,
        }
    }

    /// Tokens currently in the cache.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Runs `req` on `model` in a fresh sequence, calling `on_text` with each piece of text as soon
/// as it is final (no broken UTF-8, nothing that may still turn into a stop string). `on_text`
/// returns `false` to cancel.
pub fn generate(
    model: &TextModel,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    let mut session = Session::new(model, req.prompt_ids.len().saturating_add(req.max_tokens));
    generate_in(model, req, &mut session, on_text)
}

/// [`generate`] continuing `session`: the longest common prefix of the session's tokens and
/// the prompt is reused from its state; afterwards the session holds the prompt and the
/// generated tokens.
pub fn generate_in(
    model: &TextModel,
    req: &GenerateRequest,
    session: &mut Session,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    req.sampling.validate()?;
    let n_prompt = req.prompt_ids.len();
    let capacity = session.max_len;
    if n_prompt == 0 {
        return Err(crate::Error::InvalidInput(
            "the prompt has no tokens".into(),
        ));
    }
    if n_prompt >= capacity {
        return Err(crate::Error::InvalidInput(format!(
            "the prompt has {n_prompt} tokens; the context holds {capacity} (prompt plus at least one generated token)"
        )));
    }
    let mut memory = session
        .memory
        .take()
        .expect("a session's memory is put back");
    // Reuse the cached prefix, but always run at least the prompt's last token (its logits).
    let reuse = session
        .ids
        .iter()
        .zip(&req.prompt_ids)
        .take_while(|(a, b)| a == b)
        .count()
        .min(n_prompt - 1);
    let mut state = match session.cache.take() {
        Some(s) => s,
        None => memory.new_state(capacity)?,
    };
    // A recurrent state cannot be rewound: go back to the checkpoint when the prompt still
    // starts with it, else start over.
    let reuse = if state.can_truncate_to(reuse) {
        reuse
    } else {
        match session.checkpoint.take() {
            Some((len, cp)) if len <= reuse => {
                state = cp;
                len
            }
            _ => {
                state.clear()?;
                0
            }
        }
    };
    state.truncate(reuse);
    session.ids.clear();
    // The request can hold the session's whole capacity.
    let mut run = req.clone();
    run.max_tokens = run.max_tokens.min(capacity - n_prompt);
    let mut engine = BatchEngine::with_memory(
        model,
        EngineConfig {
            max_running: 1,
            ..EngineConfig::default()
        },
        memory,
    );
    let id = engine.submit_with_state(run, state);
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            session.memory = Some(engine.into_memory());
            return Err(e);
        }
    };
    let mut result = None;
    let mut failure = None;
    while result.is_none() {
        match engine.step_with(&mut |u| u.text.is_empty() || on_text(u.text)) {
            Ok(done) => result = done.into_iter().find(|(i, _)| *i == id).map(|(_, g)| g),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if let Some(kept) = engine.take_state(id) {
        let len = kept.state.len();
        if let (Some(cp), Some(g)) = (kept.checkpoint, &result) {
            session.checkpoint = Some((g.prompt_tokens, cp));
        }
        let mut ids = req.prompt_ids.clone();
        if let Some(g) = &result {
            ids.extend_from_slice(&g.token_ids);
        }
        ids.truncate(len);
        session.ids = ids;
        session.cache = Some(kept.state);
    }
    session.memory = Some(engine.into_memory());
    match (result, failure) {
        (_, Some(e)) => Err(e),
        (Some(g), None) => match g.error {
            Some(e) => Err(crate::Error::InvalidInput(format!(
                "output constraint failed: {e}"
            ))),
            None => Ok(g),
        },
        (None, None) => unreachable!("the loop ends with a result or a failure"),
    }
}
