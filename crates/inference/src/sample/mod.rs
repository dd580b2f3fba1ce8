//! Token sampling: from one position's logits to the next token id, plus stop strings.
//!
//! This module owns the sampling parameters, the logit processor chain, the seeded draw, the
//! top-logprobs report and the stop-string matcher ([`StopMatcher`]). It does not own the model,
//! the generation loop or detokenization.
//!
//! [`Sampler::sample`] runs, in this order:
//! 1. **Sanitize.** NaN logits count as `-inf` (never drawn). If any logit is `+inf`, those
//!    tokens share all the probability equally and every other token is removed. If every logit
//!    is `-inf`/NaN (or the vector is empty) the result is token 0 with logprob `-inf`.
//! 2. **Raw logprob.** [`Sampled::logprob`] is the log-softmax of these sanitized raw logits at
//!    the chosen token: before penalties, temperature and filters.
//! 3. **Penalties**: repetition over `history` (prompt + generated ids; Hugging Face: a seen
//!    token's logit is divided by the penalty if positive, multiplied if not, once per distinct
//!    id), then presence and frequency over the generated ids only (OpenAI, vLLM:
//!    `logit -= presence + frequency * count` for every generated id).
//! 4. **Greedy** when `temperature == 0` or `top_k == 1`: argmax of the penalized logits, ties to
//!    the lowest id; the RNG is not used, so the result does not depend on temperature, top-p,
//!    min-p or the seed.
//! 5. **Temperature**: probabilities `∝ exp((logit - max) / temperature)` (the same distribution
//!    as `softmax(logit / temperature)`, without overflow for tiny temperatures).
//! 6. **Top-k**: keep the k highest logits (ties to the lower id).
//! 7. **Top-p**: keep the smallest best-first prefix whose probability (renormalized after top-k)
//!    reaches `top_p`; at least one token.
//! 8. **Min-p**: drop tokens whose probability is below `min_p` × the top token's probability.
//! 9. **Draw** one token in proportion to what is left, with a xoshiro256** stream seeded by
//!    `seed` (or OS entropy). Weights come from a libm-free exponential
//!    ([`processors::exp_neg`]) and are summed as integers ([`processors::units`]), so the sums
//!    are exact in any order: a seed reproduces the same tokens on every run and machine, and
//!    a GPU that picks where the logits are ([`Pick`], [`crate::ops::pick_rows`]) picks the
//!    same token as the CPU from the same logits.

pub mod pick;
pub mod processors;
pub mod rng;
pub mod stop;

pub use pick::{Filters, Pick, Picked};
pub use stop::{StopMatcher, StopResult};

use crate::{Error, Result};
use processors::LogNorm;

/// How to pick the next token. The defaults sample from the model's plain distribution
/// (temperature 1, every filter and penalty off); missing fields deserialize to them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy (argmax).
    pub temperature: f32,
    /// Keep only the k most likely tokens; 0 turns it off, 1 is greedy.
    pub top_k: usize,
    /// Nucleus sampling mass in (0, 1]; 1 turns it off.
    pub top_p: f32,
    /// Drop tokens below `min_p` × the top probability, in [0, 1]; 0 turns it off.
    pub min_p: f32,
    /// Hugging Face repetition penalty (> 0); 1 turns it off.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty, subtracted once from every generated token's logit.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, subtracted once per occurrence of a generated token.
    pub frequency_penalty: f32,
    /// Seed of the random stream; `None` seeds from OS entropy (see [`Sampler::seed`]).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: temperature 0, everything else off.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when these parameters select the argmax (temperature 0 or top-k 1).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }

    /// Checks every field's range; the error names the first bad field and its value.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, want: &str, got: f32| {
            Err(Error::InvalidInput(format!(
                "sampling parameter `{field}` must be {want}, got {got}"
            )))
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", "a finite number >= 0", self.temperature);
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", self.top_p);
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad("min_p", "in [0, 1]", self.min_p);
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                "a finite number > 0",
                self.repetition_penalty,
            );
        }
        if !self.presence_penalty.is_finite() {
            return bad("presence_penalty", "finite", self.presence_penalty);
        }
        if !self.frequency_penalty.is_finite() {
            return bad("frequency_penalty", "finite", self.frequency_penalty);
        }
        Ok(())
    }
}

/// One sampled token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampled {
    /// The token id.
    pub token: u32,
    /// Log-softmax of the raw logits (before penalties and temperature) at `token`.
    pub logprob: f32,
}

/// Picks tokens from logits with fixed parameters and its own random stream; one per sequence.
///
/// Parameters that [`SamplingParams::validate`] would reject never panic: a NaN or negative
/// temperature acts as greedy, a `top_p` outside (0, 1) or a `min_p` outside (0, 1] turns that
/// filter off (`top_p <= 0` keeps one token), a repetition penalty that is not finite and > 0
/// is ignored, and a non-finite presence/frequency penalty counts as 0.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: rng::Rng,
    /// f32 [vocab]: sanitized, penalized logits of the current step.
    work: Vec<f32>,
    /// u32 [vocab]: occurrence counts of the history (all zero between steps).
    counts: Vec<u32>,
    /// The current step's penalty entries (processors::penalty_entries).
    entries: Vec<(u32, f32)>,
    /// The random stream before each unsettled [`Sampler::plan`]'s draw (`None`: a greedy
    /// plan drew nothing), oldest first: a plan may be made before the one before it is
    /// settled (a decode step run ahead of its read).
    undo: std::collections::VecDeque<Option<rng::Rng>>,
    /// Candidate ids still in play.
    cand: Vec<u32>,
    /// Unnormalized probabilities of `cand`, same order.
    weights: Vec<f32>,
}

impl Sampler {
    /// A sampler with `params`; `seed: None` draws a seed from OS entropy and the clock.
    pub fn new(params: SamplingParams) -> Self {
        let seed = params.seed.unwrap_or_else(rng::entropy_seed);
        Sampler {
            params,
            seed,
            rng: rng::Rng::from_seed(seed),
            work: Vec::new(),
            counts: Vec::new(),
            entries: Vec::new(),
            undo: std::collections::VecDeque::new(),
            cand: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the given one, or the one drawn from entropy), for reproducing a run.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Picks the next token from one position's `logits` (`f32 [vocab]`); `history` holds the
    /// prompt (its first `prompt_len` ids) and the generated ids so far, for the penalties. See
    /// the module doc for the steps.
    pub fn sample(&mut self, logits: &[f32], history: &[u32], prompt_len: usize) -> Sampled {
        let (choice, norm) = self.distribution(logits, history, prompt_len);
        let token = match choice {
            Choice::Token(t) => t,
            Choice::Weights => {
                let u = self.rng.next_f64();
                processors::draw(&self.cand, &self.weights, u)
            }
        };
        finish(logits, &norm, token)
    }

    /// Speculative decoding's choice at a position where a draft proposed `draft`: keeps it
    /// with the probability p(`draft`) the sampler gives it, else draws from the rest of the
    /// distribution (`draft` removed, renormalized); returns the token and whether it is the
    /// draft's. A draft proposes one token with certainty (prompt lookup has no distribution
    /// of its own), so this is the rejection rule of speculative sampling (Leviathan et al.,
    /// Chen et al.) with q a point mass: every token comes out with exactly its probability
    /// p(x). Greedy parameters pick the argmax, accepted when it is the draft.
    pub fn sample_draft(
        &mut self,
        logits: &[f32],
        history: &[u32],
        prompt_len: usize,
        draft: u32,
    ) -> (Sampled, bool) {
        let (choice, norm) = self.distribution(logits, history, prompt_len);
        let token = match choice {
            Choice::Token(t) => t,
            Choice::Weights => {
                let at = self.cand.iter().position(|&id| id == draft);
                let total: u64 = self.weights.iter().map(|&w| processors::units(w)).sum();
                let p = at.map_or(0.0, |j| {
                    processors::units(self.weights[j]) as f64 / total.max(1) as f64
                });
                if self.rng.next_f64() < p {
                    draft
                } else {
                    if let Some(j) = at {
                        self.weights[j] = 0.0;
                    }
                    let u = self.rng.next_f64();
                    processors::draw(&self.cand, &self.weights, u)
                }
            }
        };
        (finish(logits, &norm, token), token == draft)
    }

    /// Steps 1 and 3-8 of the module doc: the token itself when the choice is greedy (or
    /// nothing is drawable), else the candidates and their weights in `cand` / `weights`;
    /// with the raw logits' normalizer.
    fn distribution(
        &mut self,
        logits: &[f32],
        history: &[u32],
        prompt_len: usize,
    ) -> (Choice, LogNorm) {
        let norm = LogNorm::new(logits);
        processors::sanitize_into(logits, norm.inf_mode(), &mut self.work);
        processors::apply_penalties(
            &mut self.work,
            history,
            prompt_len,
            &self.params,
            &mut self.counts,
            &mut self.entries,
        );
        let filters = pick::Filters::of(&self.params);
        let choice = filters.candidates(&self.work, &mut self.cand, &mut self.weights);
        (choice, norm)
    }

    /// This step's choice as a [`Pick`], to be made where the logits are
    /// ([`crate::ops::pick_rows`]); `history` and `prompt_len` as for [`Sampler::sample`],
    /// `bias` the request's logit bias (added to the raw logits in order), `vocab` the
    /// logits' length. The random draw is taken now when the choice may need it; hand the
    /// outcome to [`Sampler::settle`] (plans are settled in the order they were made).
    pub fn plan(
        &mut self,
        history: &[u32],
        prompt_len: usize,
        bias: &[(u32, f32)],
        vocab: usize,
    ) -> Pick {
        let p = &self.params;
        let filters = pick::Filters::of(p);
        let mut penalized = Vec::new();
        let repetition = processors::penalty_entries(
            history,
            prompt_len,
            p,
            vocab,
            &mut self.counts,
            &mut penalized,
        );
        let u = if filters.is_greedy() {
            self.undo.push_back(None);
            0.0
        } else {
            self.undo.push_back(Some(self.rng.clone()));
            self.rng.next_f64()
        };
        Pick {
            filters,
            u,
            bias: bias.to_vec(),
            repetition,
            penalized,
        }
    }

    /// Takes the outcome of the oldest unsettled [`Sampler::plan`]: when the choice did not
    /// use the random draw (nothing was drawable), the stream goes back to before it, as
    /// [`Sampler::sample`] would have left it. Returns `true` when later plans were made from
    /// the stream past that draw: their draws are void (and forgotten here); their picks must
    /// be made again.
    pub fn settle(&mut self, picked: Picked) -> bool {
        match self.undo.pop_front() {
            Some(Some(rng)) if !picked.drew => {
                self.rng = rng;
                let void = !self.undo.is_empty();
                self.undo.clear();
                void
            }
            _ => false,
        }
    }
}

/// What [`Sampler::distribution`] left to do.
pub(crate) enum Choice {
    /// The choice is made.
    Token(u32),
    /// Draw from the sampler's candidates.
    Weights,
}

/// `token` with its log-softmax under the raw `logits` (see [`Sampled::logprob`]).
fn finish(logits: &[f32], norm: &LogNorm, token: u32) -> Sampled {
    Sampled {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| norm.logprob(x)),
    }
}

/// The `n` most likely tokens by raw log-softmax (NaN as `-inf`), best first, ties to the lower
/// id; fewer when the vocabulary is smaller than `n`.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let norm = LogNorm::new(logits);
    let mut clean = Vec::new();
    processors::sanitize_into(logits, norm.inf_mode(), &mut clean);
    let n = n.min(logits.len());
    let ids: Vec<u32> = if n <= processors::SMALL_K {
        processors::best_k(&clean, n)
            .into_iter()
            .map(|(_, id)| id)
            .collect()
    } else {
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        if n < ids.len() {
            ids.select_nth_unstable_by(n - 1, |&a, &b| processors::better(&clean, a, b));
            ids.truncate(n);
        }
        ids.sort_unstable_by(|&a, &b| processors::better(&clean, a, b));
        ids
    };
    ids.into_iter()
        .map(|id| (id, norm.logprob(logits[id as usize])))
        .collect()
}
