//! Output constraints: what a request may generate (a JSON Schema, any JSON object, a regular
//! expression, a Lark or a GBNF grammar), compiled over a model's vocabulary into a
//! per-sequence [`Matcher`] that masks the logits of every step to the tokens the constraint
//! allows and follows the tokens chosen.
//!
//! Two engines serve them, behind one API ([`Vocabulary`], [`Constraint`], [`Matcher`]):
//! - JSON Schemas and regular expressions go to the DFA engine first ([`dfa`]: schema →
//!   regular expression → lazy DFA, masks by a walk of a token trie cached per state), and to
//!   llguidance only where the DFA engine refuses them (a feature outside its subset:
//!   `uniqueItems`, `patternProperties`, unconstrained values, anchors in a regular
//!   expression, ...; or a schema with its own `x-guidance` options other than the compact
//!   layout both engines write, which only llguidance reads). A schema llguidance refuses too
//!   stays refused, with llguidance's message.
//! - Any JSON object, Lark and GBNF grammars (recursive, beyond regular languages) go to
//!   llguidance ([`llg`]).
//!
//! Why (`lattice bench grammar --steps 64`, the 300-schema corpus tests/fixtures/schemas/
//! corpus.jsonl, one core, two runs each; the DFA engine alone beside llguidance alone):
//! - Qwen3 vocabulary (151,669 tokens): compile p50 0.47-0.49 ms against 1.07-1.11 ms; mask
//!   p99 633-665 µs against 1,265-1,310 µs on random walks and 507-545 µs against 1,896-1,910 µs
//!   along re-tokenized outputs; mask p50 20-23 µs for both.
//! - Mistral NeMo (131,072 tokens): compile p50 0.46-0.48 ms against 0.99-1.07 ms; mask p99
//!   443-488 µs against 900-971 µs (random) and 415-452 µs against 1,523-1,563 µs (re-tokenized).
//!
//! The DFA engine refuses 13 of the 300 schemas, llguidance 8 (all unsatisfiable): together
//! they serve 292, 287 by the DFA engine and 5 by llguidance, at the DFA engine's figures (the
//! `lattice` rows of the same runs: compile p50 0.48-0.49 ms, p99 3.5-3.8 ms over all 292,
//! 2.6-2.8 ms without the 5 fallbacks; Qwen3 mask p99 634-655 µs random, 500-523 µs
//! re-tokenized). Issue 14's bar (mask p50 ≤ 50 µs, p99 ≤ 500 µs, compile p50 ≤ 5 ms) is met
//! but for the mask p99 on Qwen3 (on Mistral NeMo it is met too).
//! The vocabulary costs ~0.1 s (the DFA engine's tries); llguidance's ~0.4 s more on the first
//! spec that needs it.

use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub mod dfa;
pub mod gbnf;
pub mod llg;

use dfa::{Backend, DfaConstraint, DfaMatcher, DfaVocabulary};
use llg::{LlgConstraint, LlgMatcher, LlgVocabulary};

/// What a request may generate.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    /// JSON matching this JSON Schema (draft 2020-12).
    JsonSchema(Value),
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// Text matching this regular expression (whole output).
    Regex(String),
    /// Text in this Lark grammar (llguidance's dialect).
    Lark(String),
    /// Text in this GBNF grammar (llama.cpp's format; translated to Lark).
    Gbnf(String),
}

impl Spec {
    /// The name of the kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Spec::JsonSchema(_) => "JSON schema",
            Spec::JsonObject => "JSON object",
            Spec::Regex(_) => "regular expression",
            Spec::Lark(_) => "grammar",
            Spec::Gbnf(_) => "GBNF grammar",
        }
    }
}

/// The engine that compiled a [`Constraint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Engine {
    /// The DFA engine ([`dfa`]).
    Dfa,
    /// llguidance ([`llg`]).
    Llguidance,
}

impl Engine {
    /// The engine's name in reports (`dfa`, `llguidance`).
    pub fn name(self) -> &'static str {
        match self {
            Engine::Dfa => "dfa",
            Engine::Llguidance => "llguidance",
        }
    }
}

/// A model's vocabulary as constraints see it (built once per model): the DFA engine's token
/// tries, and llguidance's vocabulary, built on first use (most requests never need it), and
/// the compiler of [`Spec`]s over them.
pub struct Vocabulary {
    dfa: DfaVocabulary,
    eos: u32,
    /// The token byte strings llguidance's vocabulary is built from, until it is.
    llg_words: Mutex<Vec<Vec<u8>>>,
    llg: OnceLock<std::result::Result<LlgVocabulary, String>>,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocabulary({} tokens)", self.dfa.n_vocab())
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` for a model with `n_vocab` logits (ids past the
    /// tokenizer's are never allowed); `eos` ends a completed constraint. Builds the DFA
    /// engine's tries (~0.1 s for Qwen3's 151k tokens) and keeps the token bytes for
    /// llguidance's vocabulary (~0.4 s more, on the first spec that needs it).
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize, eos: u32) -> Result<Self> {
        Ok(Self {
            dfa: DfaVocabulary::new(tokenizer, n_vocab, eos)?,
            eos,
            llg_words: Mutex::new(llg::words(tokenizer, n_vocab)),
            llg: OnceLock::new(),
        })
    }

    /// llguidance's vocabulary, built on the first call.
    pub fn llguidance(&self) -> Result<&LlgVocabulary> {
        self.llg
            .get_or_init(|| {
                let words =
                    std::mem::take(&mut *self.llg_words.lock().unwrap_or_else(|e| e.into_inner()));
                LlgVocabulary::from_words(&words, self.eos).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::InvalidInput(e.clone()))
    }

    /// Compiles `spec` with the engine that serves it (see the module documentation); an
    /// unsupported feature or an invalid schema, expression or grammar is an error naming it
    /// and the spec's kind ([`Spec::kind`]).
    pub fn compile(&self, spec: &Spec) -> Result<Constraint> {
        let first = match spec {
            // The DFA engine writes the compact layout only: a schema's own other layout
            // options are llguidance's to follow.
            Spec::JsonSchema(s)
                if s.get("x-guidance")
                    .is_none_or(|g| *g == llg::compact_options()) =>
            {
                self.dfa.compile(s).ok()
            }
            Spec::Regex(r) => self.dfa.compile_regex(r, Backend::default()).ok(),
            _ => None,
        };
        let inner = match first {
            Some(c) => Inner::Dfa(c),
            None => Inner::Llg(Box::new(self.llguidance()?.compile(spec)?)),
        };
        Ok(Constraint { inner })
    }
}

#[derive(Clone)]
enum Inner {
    Dfa(DfaConstraint),
    /// Boxed: llguidance's parser state is large.
    Llg(Box<LlgConstraint>),
}

/// A compiled constraint; each sequence that follows it takes its own [`Matcher`].
#[derive(Clone)]
pub struct Constraint {
    inner: Inner,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Constraint({})", self.engine().name())
    }
}

impl Constraint {
    /// A matcher at the start of the output.
    pub fn matcher(&self) -> Matcher {
        Matcher {
            inner: match &self.inner {
                Inner::Dfa(c) => MatcherInner::Dfa(c.matcher()),
                Inner::Llg(c) => MatcherInner::Llg(Box::new(c.matcher())),
            },
        }
    }

    /// The engine that compiled it.
    pub fn engine(&self) -> Engine {
        match self.inner {
            Inner::Dfa(_) => Engine::Dfa,
            Inner::Llg(_) => Engine::Llguidance,
        }
    }
}

enum MatcherInner {
    Dfa(DfaMatcher),
    /// Boxed: llguidance's matcher state is large.
    Llg(Box<LlgMatcher>),
}

/// One sequence's place in its constraint.
pub struct Matcher {
    inner: MatcherInner,
}

impl std::fmt::Debug for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Matcher")
    }
}

impl Matcher {
    /// Sets the logits of every token the constraint does not allow next to -inf (`logits`
    /// holds the model's whole vocabulary; ids past the vocabulary are never allowed).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        match &mut self.inner {
            MatcherInner::Dfa(m) => m.mask(logits),
            MatcherInner::Llg(m) => m.mask(logits),
        }
    }

    /// Follows the chosen token.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        match &mut self.inner {
            MatcherInner::Dfa(m) => m.accept(token),
            MatcherInner::Llg(m) => m.accept(token),
        }
    }

    /// Whether the constraint is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        match &self.inner {
            MatcherInner::Dfa(m) => m.is_done(),
            MatcherInner::Llg(m) => m.is_done(),
        }
    }

    /// How many of `tokens`, in order from here, the constraint allows (the matcher does not
    /// move): a speculative draft is cut to that prefix before it is verified.
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        match &mut self.inner {
            MatcherInner::Dfa(m) => {
                let mut m = m.clone();
                tokens.iter().take_while(|&&t| m.accept(t).is_ok()).count()
            }
            MatcherInner::Llg(m) => m.valid_prefix(tokens),
        }
    }
}

/// Sets `logits[i]` to -inf wherever bit `i` of `allowed` (bit `i % 32` of word `i / 32`) is
/// clear, and past `n_vocab`; whole words allowed are skipped.
fn apply_mask(allowed: &[u32], n_vocab: usize, logits: &mut [f32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        let bits = allowed.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && (w + 1) * 32 <= n_vocab {
            continue;
        }
        if bits == 0 {
            chunk.fill(f32::NEG_INFINITY);
            continue;
        }
        for (j, l) in chunk.iter_mut().enumerate() {
            if bits >> j & 1 == 0 || w * 32 + j >= n_vocab {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}
