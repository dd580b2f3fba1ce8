//! The engines `lattice bench grammar` races behind one interface (the product's choice
//! through `grammar::Vocabulary`, the DFA engine alone through `grammar::dfa::DfaVocabulary`,
//! llguidance alone through `grammar::llg::LlgVocabulary`), and the two walks it times: the
//! seeded random walk and the canonical walk along a re-tokenized output.

use std::time::Instant;

use lattice_inference::grammar::dfa::{Backend, DfaConstraint, DfaMatcher, DfaVocabulary};
use lattice_inference::grammar::llg::{LlgConstraint, LlgMatcher, LlgVocabulary};
use lattice_inference::grammar::{Constraint, Engine, Matcher, Spec, Vocabulary};
use lattice_inference::sample::rng::Rng;
use lattice_inference::tokenizer::Tokenizer;
use lattice_inference::Result;
use serde_json::Value;

/// Which engine.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// What Lattice serves with (`grammar::Vocabulary`): the DFA engine, llguidance where the
    /// DFA engine refuses a schema.
    Lattice,
    /// The DFA engine alone (JSON Schema -> regex -> DFA, grammar/dfa/).
    Dfa,
    /// The llguidance crate alone.
    Llguidance,
}

impl Kind {
    /// The engine's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Lattice => "lattice",
            Kind::Dfa => "dfa",
            Kind::Llguidance => "llguidance",
        }
    }
}

/// An engine's vocabulary (built once).
pub enum Vocab {
    /// The product's choice.
    Lattice(Vocabulary),
    /// The DFA engine, with the automaton it compiles to.
    Dfa(DfaVocabulary, Backend),
    /// llguidance.
    Llg(LlgVocabulary),
}

/// A compiled schema.
pub enum Compiled {
    /// The product's choice.
    Lattice(Constraint),
    /// The DFA engine.
    Dfa(DfaConstraint),
    /// llguidance (boxed: its parser state is large).
    Llg(Box<LlgConstraint>),
}

/// A sequence's place in a compiled schema.
pub enum Walker {
    /// The product's choice.
    Lattice(Matcher),
    /// The DFA engine.
    Dfa(DfaMatcher),
    /// llguidance (boxed: its parser state is large).
    Llg(Box<LlgMatcher>),
}

impl Vocab {
    /// The vocabulary of `tok` for `kind` (`backend`: the DFA engine's automaton, when alone).
    pub fn new(
        kind: Kind,
        tok: &Tokenizer,
        n_vocab: usize,
        eos: u32,
        backend: Backend,
    ) -> Result<Self> {
        Ok(match kind {
            Kind::Lattice => Vocab::Lattice(Vocabulary::new(tok, n_vocab, eos)?),
            Kind::Dfa => Vocab::Dfa(DfaVocabulary::new(tok, n_vocab, eos)?, backend),
            Kind::Llguidance => Vocab::Llg(LlgVocabulary::new(tok, n_vocab, eos)?),
        })
    }

    /// Compiles `schema`.
    pub fn compile(&self, schema: &Value) -> Result<Compiled> {
        let spec = || Spec::JsonSchema(schema.clone());
        Ok(match self {
            Vocab::Lattice(v) => Compiled::Lattice(v.compile(&spec())?),
            Vocab::Dfa(v, b) => Compiled::Dfa(v.compile_with(schema, *b)?),
            Vocab::Llg(v) => Compiled::Llg(Box::new(v.compile(&spec())?)),
        })
    }
}

impl Compiled {
    /// A walker at the start of the output.
    pub fn walker(&self) -> Walker {
        match self {
            Compiled::Lattice(c) => Walker::Lattice(c.matcher()),
            Compiled::Dfa(c) => Walker::Dfa(c.matcher()),
            Compiled::Llg(c) => Walker::Llg(Box::new(c.matcher())),
        }
    }

    /// The engine that compiled it.
    pub fn engine(&self) -> Engine {
        match self {
            Compiled::Lattice(c) => c.engine(),
            Compiled::Dfa(_) => Engine::Dfa,
            Compiled::Llg(_) => Engine::Llguidance,
        }
    }
}

impl Walker {
    fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        match self {
            Walker::Lattice(m) => m.mask(logits),
            Walker::Dfa(m) => m.mask(logits),
            Walker::Llg(m) => m.mask(logits),
        }
    }

    /// Follows `token`.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        match self {
            Walker::Lattice(m) => m.accept(token),
            Walker::Dfa(m) => m.accept(token),
            Walker::Llg(m) => m.accept(token),
        }
    }

    /// Whether the constraint allows nothing more.
    pub fn is_done(&self) -> bool {
        match self {
            Walker::Lattice(m) => m.is_done(),
            Walker::Dfa(m) => m.is_done(),
            Walker::Llg(m) => m.is_done(),
        }
    }

    /// Masks `logits` (reset to 0 first), timed in microseconds.
    fn timed_mask(&mut self, logits: &mut [f32]) -> Result<f64> {
        logits.fill(0.0);
        let t = Instant::now();
        self.mask(logits)?;
        Ok(t.elapsed().as_secs_f64() * 1e6)
    }
}

/// What the walk of one schema gave.
#[derive(Default)]
pub struct Walk {
    /// Each mask's time (µs).
    pub mask_us: Vec<f64>,
    /// The tokens taken (without EOS).
    pub tokens: Vec<u32>,
    /// Whether the output completed (EOS taken or nothing more allowed).
    pub finished: bool,
}

/// Up to `steps` tokens: mask, then a random allowed token; tokens that only close strings and
/// structures (`closers`) are taken 1 step in 2 when allowed, so that walks finish.
pub fn random_walk(
    w: &mut Walker,
    steps: usize,
    eos: u32,
    closers: &[bool],
    rng: &mut Rng,
    logits: &mut [f32],
) -> Result<Walk> {
    let mut out = Walk::default();
    for _ in 0..steps {
        out.mask_us.push(w.timed_mask(logits)?);
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&id| logits[id as usize] == 0.0)
            .collect();
        if allowed.is_empty() {
            break;
        }
        let close: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&id| closers[id as usize])
            .collect();
        let pool = if !close.is_empty() && rng.next_u64().is_multiple_of(2) {
            &close
        } else {
            &allowed
        };
        let token = pool[(rng.next_u64() % pool.len() as u64) as usize];
        if token == eos {
            out.finished = true;
            break;
        }
        w.accept(token)?;
        out.tokens.push(token);
        if w.is_done() {
            out.finished = true;
            break;
        }
    }
    Ok(out)
}

/// Masks along exactly `tokens` and then the end (EOS must be allowed unless the constraint is
/// done): each mask timed, and the tokens the mask did not allow counted (the walk stops at the
/// first, which for an engine's own output is a bug).
pub fn canonical_walk(
    w: &mut Walker,
    tokens: &[u32],
    eos: u32,
    logits: &mut [f32],
) -> Result<(Vec<f64>, usize)> {
    let mut us = Vec::new();
    for &t in tokens.iter().chain([&eos]) {
        if t == eos && w.is_done() {
            break;
        }
        us.push(w.timed_mask(logits)?);
        if logits[t as usize] != 0.0 || (t != eos && w.accept(t).is_err()) {
            return Ok((us, 1));
        }
    }
    Ok((us, 0))
}

/// The text of `tokens` (their bytes; `None` when not UTF-8).
pub fn text_of(tok: &Tokenizer, tokens: &[u32]) -> Option<String> {
    let mut bytes = Vec::new();
    for &t in tokens {
        bytes.extend(tok.token_bytes(t)?.0);
    }
    String::from_utf8(bytes).ok()
}

/// `text` tokenized as the model's tokenizer writes it (no special tokens); `None` when the
/// tokens do not spell `text` back byte for byte.
pub fn retokenize(tok: &Tokenizer, text: &str) -> Option<Vec<u32>> {
    let ids = tok.encode(text, false).ids;
    (text_of(tok, &ids).as_deref() == Some(text)).then_some(ids)
}

/// Whether a compiled schema accepts `tokens` as a complete output (the DFA engine alone:
/// their text run through its automaton; the others: the tokens followed without masks, then
/// the end).
pub fn accepts(
    c: &Compiled,
    tok: &Tokenizer,
    tokens: &[u32],
    eos: u32,
    logits: &mut [f32],
) -> bool {
    if let Compiled::Dfa(c) = c {
        return text_of(tok, tokens).is_some_and(|t| c.matches(t.as_bytes()));
    }
    let mut w = c.walker();
    tokens.iter().all(|&t| w.accept(t).is_ok())
        && (w.is_done() || (w.timed_mask(logits).is_ok() && logits[eos as usize] == 0.0))
}
