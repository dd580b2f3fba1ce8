//! The request vocabulary every part of the engine speaks: what to generate
//! ([`GenerateRequest`]), what came out ([`Generation`], [`TokenLogprob`]) and why it ended
//! ([`FinishReason`]).

use crate::sample::SamplingParams;

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
    /// What the output must match (compiled by [`TextModel::compile_constraint`]); every
    /// step's choice is masked to the tokens it allows, and generation ends when it is complete.
    ///
    /// [`TextModel::compile_constraint`]: super::TextModel::compile_constraint
    pub constraint: Option<crate::grammar::Constraint>,
    /// Added to the logits of these token ids before each choice (OpenAI `logit_bias`: -100
    /// bans a token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Keep special tokens (other than the ones that end generation) in the text, for callers
    /// that parse markers such as a tool call's `<tool_call>` or `[TOOL_CALLS]`.
    pub keep_special_tokens: bool,
    /// Speculative decoding: draft up to this many tokens per step and verify them in the
    /// step's forward pass (0: off). The output is the same (greedy) or has the same
    /// distribution (sampling); models on a GPU do not draft yet
    /// ([`TextModel::draft_refusal`](super::TextModel::draft_refusal)).
    pub draft_tokens: usize,
    /// Where drafts come from when `draft_tokens > 0`.
    pub drafter: super::speculate::Drafter,
    /// The LoRA adapters this request runs with, prepared by the model's selectable plan
    /// ([`crate::lora::LoraPlan::prepare`]); empty runs the model's default (the base model of
    /// a selectable plan). Requests with different adapters share a batch; cached prompt
    /// prefixes are shared only between requests with the same adapters and scales.
    pub lora: crate::lora::Selection,
    /// The images of a vision-language model's prompt, in the order of their placeholder
    /// runs in `prompt_ids` (each placeholder expanded to the image's token count, see
    /// [`VisionModel::expand_placeholders`](super::VisionModel::expand_placeholders)).
    pub images: Vec<std::sync::Arc<crate::vision::PreparedImage>>,
}

impl GenerateRequest {
    /// Whether each next token is the plain argmax of the logits: greedy, no penalties, no
    /// log-probabilities, no `logit_bias` and no constraint.
    pub fn picks_argmax(&self) -> bool {
        let p = &self.sampling;
        self.constraint.is_none()
            && self.logit_bias.is_empty()
            && p.is_greedy()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && self.logprobs.is_none()
    }

    /// A request with default sampling and no stop strings.
    pub fn new(prompt_ids: Vec<u32>, max_tokens: usize, sampling: SamplingParams) -> Self {
        Self {
            prompt_ids,
            max_tokens,
            sampling,
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            constraint: None,
            logit_bias: Vec::new(),
            keep_special_tokens: false,
            draft_tokens: 0,
            drafter: super::speculate::Drafter::Ngram,
            lora: crate::lora::Selection::default(),
            images: Vec::new(),
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
    /// Set when the output constraint failed (an engine limit of a hostile grammar, say): the
    /// text so far is not a complete output, and callers report this message as an error.
    pub error: Option<String>,
    /// Per-token log-probabilities, when requested.
    pub logprobs: Vec<TokenLogprob>,
    /// Speculative decoding: tokens drafted, and those of them the model kept.
    pub drafted_tokens: usize,
    /// See `drafted_tokens`.
    pub accepted_tokens: usize,
    /// Drafts verified (`drafted_tokens / drafts` is the mean draft length).
    pub drafts: usize,
    /// Seconds spent on the prompt (prefill, up to the first token's logits).
    pub prefill_secs: f64,
    /// Seconds spent on the decode steps after the first token.
    pub decode_secs: f64,
}
