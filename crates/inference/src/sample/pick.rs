//! A step's choice as plain data ([`Pick`]), so that it can be made where the logits are: the
//! CPU runs [`Pick::choose`], a GPU runs the same steps in a kernel and sends back only the
//! token. A [`super::Sampler`] makes the plan ([`super::Sampler::plan`]: penalties from its
//! history, the random draw from its stream) and takes the outcome back
//! ([`super::Sampler::settle`]).

use super::processors;
use super::Choice;

/// The filters of the module doc of [`super`] (steps 4-8), as the sampler applies them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Filters {
    /// Softmax temperature; 0 (or NaN, or negative) picks the argmax.
    pub temperature: f32,
    /// Keep the k best; 0 off, 1 the argmax.
    pub top_k: usize,
    /// Nucleus mass; 1 (or more) off.
    pub top_p: f32,
    /// Relative probability floor; 0 off, outside (0, 1] off.
    pub min_p: f32,
}

impl Filters {
    /// The filters of `params`.
    pub fn of(params: &super::SamplingParams) -> Self {
        Filters {
            temperature: params.temperature,
            top_k: params.top_k,
            top_p: params.top_p,
            min_p: params.min_p,
        }
    }

    /// The argmax.
    pub fn greedy() -> Self {
        Filters {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
        }
    }

    /// True when the choice is the argmax (no random draw).
    pub fn is_greedy(&self) -> bool {
        let t = self.temperature;
        self.top_k == 1 || t.is_nan() || t <= 0.0
    }

    /// Steps 4-8 over `work` (sanitized, penalized logits): the token when the choice is
    /// greedy or nothing is drawable, else the candidates (in id order) and their weights in
    /// `cand` / `weights`.
    pub(crate) fn candidates(
        &self,
        work: &[f32],
        cand: &mut Vec<u32>,
        weights: &mut Vec<f32>,
    ) -> Choice {
        if self.is_greedy() {
            return Choice::Token(processors::argmax(work) as u32);
        }
        cand.clear();
        cand.extend(
            work.iter()
                .enumerate()
                .filter(|(_, &x)| x > f32::NEG_INFINITY)
                .map(|(i, _)| i as u32),
        );
        if cand.is_empty() {
            return Choice::Token(processors::argmax(work) as u32);
        }
        processors::top_k(work, cand, self.top_k);
        let max = if cand.len() == work.len() {
            processors::max_lanes(work)
        } else {
            cand.iter()
                .map(|&id| work[id as usize])
                .fold(f32::NEG_INFINITY, f32::max)
        };
        processors::weights_into(work, cand, max, self.temperature, weights);
        let p = self.top_p;
        if p < 1.0 {
            processors::top_p(work, cand, weights, p.max(0.0));
        }
        let m = self.min_p;
        if m > 0.0 && m <= 1.0 {
            processors::min_p(cand, weights, m);
        }
        Choice::Weights
    }
}

/// One row's choice, complete: what [`Pick::choose`] (or a GPU kernel) needs besides the
/// logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Pick {
    /// Temperature and filters.
    pub filters: Filters,
    /// The uniform draw in `[0, 1)` (unused when the choice is greedy or nothing is drawable).
    pub u: f64,
    /// Added to the raw logits first, one pair after the other (a request's logit bias).
    pub bias: Vec<(u32, f32)>,
    /// Repetition penalty of the `penalized` ids (1: none).
    pub repetition: f32,
    /// Distinct history ids with the amount subtracted after the repetition penalty
    /// ([`processors::penalty_entries`]).
    pub penalized: Vec<(u32, f32)>,
}

/// What [`Pick::choose`] picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Picked {
    /// The token id.
    pub token: u32,
    /// Whether the random draw was used (false for greedy choices and rows with nothing
    /// drawable).
    pub drew: bool,
}

impl Picked {
    /// The bit of [`Picked::code`] that says the draw was used.
    const DREW: u32 = 1 << 31;

    /// The picked row as one `u32`, as a GPU writes it: the token, with the top bit set when
    /// the draw was used.
    pub fn code(self) -> u32 {
        self.token | if self.drew { Self::DREW } else { 0 }
    }

    /// The inverse of [`Picked::code`].
    pub fn from_code(code: u32) -> Self {
        Picked {
            token: code & !Self::DREW,
            drew: code & Self::DREW != 0,
        }
    }
}

impl Pick {
    /// The argmax of the raw logits.
    pub fn argmax() -> Self {
        Pick {
            filters: Filters::greedy(),
            u: 0.0,
            bias: Vec::new(),
            repetition: 1.0,
            penalized: Vec::new(),
        }
    }

    /// True when the choice is the plain argmax of the raw logits.
    pub fn is_argmax(&self) -> bool {
        self.filters.is_greedy()
            && self.bias.is_empty()
            && (self.repetition == 1.0 || self.penalized.is_empty())
            && self.penalized.iter().all(|&(_, sub)| sub == 0.0)
    }

    /// Makes the choice over one row of raw `logits` on the CPU: the bias, then
    /// [`super::Sampler::sample`]'s steps (sanitize, penalties, filters, draw).
    pub fn choose(&self, logits: &[f32]) -> Picked {
        let biased;
        let raw = if self.bias.is_empty() {
            logits
        } else {
            let mut b = logits.to_vec();
            for &(id, v) in &self.bias {
                if let Some(x) = b.get_mut(id as usize) {
                    *x += v;
                }
            }
            biased = b;
            &biased
        };
        let inf_mode = processors::max_lanes(raw) == f32::INFINITY;
        let mut work = Vec::new();
        processors::sanitize_into(raw, inf_mode, &mut work);
        processors::apply_penalty_entries(&mut work, self.repetition, &self.penalized);
        let (mut cand, mut weights) = (Vec::new(), Vec::new());
        match self.filters.candidates(&work, &mut cand, &mut weights) {
            Choice::Token(token) => Picked { token, drew: false },
            Choice::Weights => Picked {
                token: processors::draw(&cand, &weights, self.u),
                drew: true,
            },
        }
    }
}
