//! One generation request, start to finish.

use std::time::Instant;

use crate::model::decoder::Outputs;
use crate::sample::SamplingParams;
use crate::state::SeqState;
use crate::{Error, Result};

use super::sequence::Sequence;
use super::TextModel;

/// Prompt tokens per prefill pass: bounds the activations of very long prompts.
pub(crate) const PREFILL_CHUNK: usize = 512;

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt, already tokenized (see [`TextModel::encode_prompt`] / `encode_chat`).
    pub prompt_ids: Vec<u32>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Sampling parameters (temperature 0 = greedy).
    pub sampling: SamplingParams,
    /// Strings that end generation; they are not part of the returned text.
    pub stop: Vec<String>,
    /// When set, record each token's log-probability and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Keep generating through end-of-sequence tokens (benchmarks, tests).
    pub ignore_eos: bool,
}

impl GenerateRequest {
    /// A request with default sampling and no stop strings.
    pub fn new(prompt_ids: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> Self {
        Self {
            prompt_ids,
            max_tokens,
            sampling,
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The caller's callback asked to stop (e.g. the client went away).
    Cancelled,
}

impl FinishReason {
    /// The OpenAI spelling (`stop`, `length`; cancelled reads as `stop`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// Log-probability of one generated token (of the model's raw distribution).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens at that step with theirs, best first.
    pub top: Vec<(u32, f32)>,
}

/// The result of a request.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated text (special tokens and stop strings left out).
    pub text: String,
    /// Every generated token id, a final end-of-sequence token included.
    pub token_ids: Vec<u32>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values were reused from the session's cache (not run).
    pub cached_prompt_tokens: usize,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Per-token log-probabilities, when requested.
    pub logprobs: Vec<TokenLogprob>,
    /// Seconds spent on the prompt (prefill, up to the first token's logits).
    pub prefill_secs: f64,
    /// Seconds spent on the decode steps after the first token.
    pub decode_secs: f64,
}

/// A sequence kept across requests (a chat): its KV cache and the tokens in it. A new request
/// whose prompt starts with tokens already in the cache only runs the rest.
#[derive(Debug)]
pub struct Session {
    cache: SeqState,
    ids: Vec<u32>,
    /// For states that cannot be rewound (recurrent layers): a snapshot taken at the end of the
    /// last prompt, before generation, and how many tokens it holds. The next turn's prompt
    /// usually extends that prompt, so it restarts from here instead of from nothing.
    checkpoint: Option<(usize, SeqState)>,
}

impl Session {
    /// An empty session for `model`, holding up to `max_len` tokens (capped at its context).
    pub fn new(model: &TextModel, max_len: usize) -> Self {
        Self {
            cache: model.new_cache(max_len),
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
/// the prompt is reused from its cache; afterwards the session holds the prompt and the
/// generated tokens.
pub fn generate_in(
    model: &TextModel,
    req: &GenerateRequest,
    session: &mut Session,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<Generation> {
    req.sampling.validate()?;
    let decoder = model.decoder.as_ref();
    let n_prompt = req.prompt_ids.len();
    let capacity = session.cache.max_len();
    if n_prompt == 0 {
        return Err(Error::InvalidInput("the prompt has no tokens".into()));
    }
    if n_prompt >= capacity {
        return Err(Error::InvalidInput(format!(
            "the prompt has {n_prompt} tokens; the context holds {capacity} (prompt plus at least one generated token)"
        )));
    }
    // Reuse the cached prefix, but always run at least the prompt's last token (its logits).
    let reuse = session
        .ids
        .iter()
        .zip(&req.prompt_ids)
        .take_while(|(a, b)| a == b)
        .count()
        .min(n_prompt - 1);
    // A recurrent state cannot be rewound: go back to the checkpoint when the prompt still
    // starts with it, else start over.
    let reuse = if session.cache.can_truncate_to(reuse) {
        reuse
    } else {
        match session.checkpoint.take() {
            Some((len, state)) if len <= reuse => {
                session.cache = state;
                len
            }
            _ => {
                session.cache.clear();
                0
            }
        }
    };
    session.cache.truncate(reuse);
    session.ids.truncate(reuse);
    let cache = &mut session.cache;
    let mut seq = Sequence::new(model, req.clone(), reuse);

    let t0 = Instant::now();
    let mut logits = Vec::new();
    for chunk in req.prompt_ids[reuse..].chunks(PREFILL_CHUNK) {
        logits = decoder.forward(
            chunk,
            &[chunk.len()],
            &mut [&mut *cache],
            Outputs::LastLogits,
        )?;
    }
    let prefill_secs = t0.elapsed().as_secs_f64();
    if !cache.can_truncate_to(0) {
        // Keep the state at the end of the prompt for the next turn (see `Session`).
        session.checkpoint = Some((n_prompt, cache.clone()));
    }
    let t1 = Instant::now();
    if req.max_tokens > 0 {
        while let Some(token) = seq.accept(&logits, cache.len() < cache.max_len(), on_text) {
            logits = decoder.forward(&[token], &[1], &mut [&mut *cache], Outputs::LastLogits)?;
        }
    }
    session.ids = seq.history()[..cache.len()].to_vec();
    let mut out = seq.into_generation();
    out.prefill_secs = prefill_secs;
    out.decode_secs = t1.elapsed().as_secs_f64();
    Ok(out)
}
