//! The DFA engine: Lattice's own JSON Schema and regular-expression constraints (Outlines /
//! XGrammar style), what [`super::Vocabulary`] compiles those with first (falling back to
//! llguidance where this engine refuses a schema); `lattice bench grammar --engine
//! lattice|dfa|llguidance|all` measures it beside llguidance on the same schemas and walks.
//!
//! Files: this one holds the API ([`DfaVocabulary`], [`DfaConstraint`], [`DfaMatcher`]);
//! `schema.rs` translates JSON Schemas into regular expressions (`scalar.rs`: the expressions of
//! strings and numbers); `automaton.rs` holds the lazy and dense DFAs and their per-state
//! caches; `trie.rs` the token tries and the mask walk.
//!
//! How it works: a JSON Schema is translated to one regular expression over the bytes of its
//! compact JSON text (`", "` between items, `": "` after keys, no other whitespace, properties in
//! declared order) and compiled by `regex-automata` into an anchored byte automaton, one of two
//! [`Backend`]s: a lazy DFA (`hybrid`, the default: compiles in the time of the NFA, states are
//! determinized on their first visit) or a dense DFA (determinized at compile time, copied into
//! a table of its live states; 10x slower to compile on the corpus, cheaper first visits). A
//! vocabulary is a byte trie of every token (built once per model). The mask of a state is the
//! set of tokens whose whole byte string keeps the automaton live, found by a depth-first walk
//! of the trie that follows transitions and skips a subtree as soon as the automaton dies; it
//! is cached per state as a bit set, so a repeat visit costs a lookup. Inside strings most of
//! the vocabulary is live, so the vocabulary also keeps the "pure" tokens (only characters a
//! JSON string holds unescaped) apart, as bit sets by character count: where every such
//! character takes a state to one same next state, for `r` characters, the pure tokens allowed
//! are exactly those of at most `r` characters (checked on the automaton's byte classes, not
//! assumed), and only the other tokens are walked (on Qwen3's vocabulary, 4% of the trie).
//!
//! Supported (the subset the translation is exact or a strict subset for; a strict subset means
//! every output is valid, but not every valid JSON can be produced):
//! - `type` (one or a list), `enum` / `const` (any JSON values), `boolean`, `null`;
//! - objects: `properties` in declared order, `required`; optional properties may be skipped.
//!   Objects are always closed: no properties beyond `properties` are generated, whatever
//!   `additionalProperties` says (a strict subset when it is not `false`);
//! - strings: `minLength` / `maxLength` (in characters; JSON escapes count as one), `pattern`
//!   (embedded: anchors at the ends only; characters that JSON must escape are left out of
//!   classes, ECMA `\d` / `\w` are ASCII), `format` `date`, `time`, `date-time`, `uuid`, `email`,
//!   `uri` (conservative regular subsets of each: e.g. no leap days, `http(s)` URIs only);
//! - integers with any of `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` and
//!   `multipleOf` 1, 2, 5 or 10; numbers unbounded (with exponents) or with integral bounds
//!   (then without exponents);
//! - arrays: `items`, `prefixItems` (tuples; without `items` no further items are generated),
//!   `minItems` / `maxItems`;
//! - `anyOf`; `oneOf` when its branches are disjoint (different JSON types or different
//!   literals); `allOf` of objects and compatible bounds (merged); local `$ref` (`#`,
//!   `#/$defs/..`, any JSON pointer in the document) inlined, a recursive reference at most
//!   [`MAX_REF_DEPTH`] times on a path (deeper, the branch that needs it is cut off).
//!
//! Not supported, refused with an error naming the feature and its JSON path: unconstrained
//! values (`{}`, `true`, a schema without a type-determining keyword), remote references,
//! `patternProperties`, `propertyNames`, `minProperties` / `maxProperties`, `dependent*`,
//! `if` / `then` / `else`, `not`, `contains`, `uniqueItems`, `multipleOf` on numbers or other than
//! 1 / 2 / 5 / 10, non-integral number bounds, `format`s other than those above, `pattern` or
//! `format` together with length bounds that cannot be checked statically, overlapping `oneOf`
//! branches, schemas whose NFA or dense DFA exceeds [`DFA_SIZE_LIMIT`] (dense determinization
//! can blow up on large schemas), and, at mask time, a lazy DFA whose cache would pass 256 MiB.
//! Regular expressions: `regex-syntax` syntax, matched by the whole output; anchors and word
//! boundaries are refused (the whole output is matched anyway).

mod automaton;
mod scalar;
mod schema;
mod trie;

use std::sync::Arc;

use regex_syntax::hir::{Hir, HirKind};
use serde_json::Value;

pub use automaton::{Backend, DFA_SIZE_LIMIT};
pub use schema::{schema_regex, MAX_REF_DEPTH};

use automaton::{Auto, State};
use trie::Tokens;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// A model's vocabulary for the DFA engine: every token's bytes in a trie (built once per
/// model), and the compiler of JSON Schemas and regular expressions over it.
#[derive(Clone)]
pub struct DfaVocabulary {
    tokens: Arc<Tokens>,
}

impl std::fmt::Debug for DfaVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DfaVocabulary({} tokens, {} trie nodes)",
            self.tokens.n_vocab,
            self.tokens.trie_nodes()
        )
    }
}

impl DfaVocabulary {
    /// The vocabulary of `tokenizer` for a model with `n_vocab` logits (ids past the
    /// tokenizer's, special tokens, empty tokens and tokens with bytes that UTF-8 never holds
    /// are never allowed); `eos` is allowed exactly where the constraint is complete.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize, eos: u32) -> Result<Self> {
        Ok(Self {
            tokens: Arc::new(Tokens::new(tokenizer, n_vocab, eos)?),
        })
    }

    /// The number of logits masks cover.
    pub fn n_vocab(&self) -> usize {
        self.tokens.n_vocab
    }

    /// The number of nodes of the token trie.
    pub fn trie_nodes(&self) -> usize {
        self.tokens.trie_nodes()
    }

    /// The number of nodes of the trie of the tokens that are not pure string content (the
    /// trie walked in string states).
    pub fn impure_trie_nodes(&self) -> usize {
        self.tokens.impure_trie_nodes()
    }

    /// Compiles a JSON Schema with the default [`Backend`]; a feature outside the supported
    /// subset (see the module documentation) is an error naming it and its JSON path, as is a
    /// schema whose automaton is too large.
    pub fn compile(&self, schema: &Value) -> Result<DfaConstraint> {
        self.compile_with(schema, Backend::default())
    }

    /// [`Self::compile`] with the given automaton.
    pub fn compile_with(&self, schema: &Value, backend: Backend) -> Result<DfaConstraint> {
        self.compile_hir(&schema::translate(schema)?, backend)
    }

    /// Compiles a regular expression (`regex-syntax` syntax) that the whole output must match;
    /// an invalid one is an error, and so is one with anchors or word boundaries (not
    /// supported by this engine).
    pub fn compile_regex(&self, re: &str, backend: Backend) -> Result<DfaConstraint> {
        let hir = regex_syntax::ParserBuilder::new()
            .build()
            .parse(re)
            .map_err(|e| Error::InvalidInput(format!("invalid regular expression: {e}")))?;
        if has_look(&hir) {
            let what = "anchors and word boundaries are not supported by the DFA engine";
            return Err(Error::InvalidInput(format!("regular expression: {what}")));
        }
        self.compile_hir(&hir, backend)
    }

    fn compile_hir(&self, hir: &Hir, backend: Backend) -> Result<DfaConstraint> {
        let auto = Auto::build(hir, backend)?;
        Ok(DfaConstraint {
            inner: Arc::new(Compiled {
                chars: auto.char_paths(),
                auto,
                tokens: self.tokens.clone(),
            }),
        })
    }
}

/// Whether an expression holds an anchor or a word boundary.
fn has_look(h: &Hir) -> bool {
    match h.kind() {
        HirKind::Look(_) => true,
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) => false,
        HirKind::Repetition(r) => has_look(&r.sub),
        HirKind::Capture(c) => has_look(&c.sub),
        HirKind::Concat(v) | HirKind::Alternation(v) => v.iter().any(has_look),
    }
}

/// What a constraint's matchers share: the automaton (with its caches) and the vocabulary.
struct Compiled {
    auto: Auto,
    tokens: Arc<Tokens>,
    /// The safe JSON characters by the automaton's byte classes (see [`Auto::char_paths`]).
    chars: Vec<Vec<u8>>,
}

/// A compiled schema or expression (an automaton and its per-state mask cache, shared by every
/// matcher made from it); each sequence that follows it takes its own [`DfaMatcher`].
#[derive(Clone)]
pub struct DfaConstraint {
    inner: Arc<Compiled>,
}

impl std::fmt::Debug for DfaConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.states() {
            Some(n) => write!(f, "DfaConstraint(dense, {n} states)"),
            None => f.write_str("DfaConstraint(lazy)"),
        }
    }
}

impl DfaConstraint {
    /// A matcher at the start of the output.
    pub fn matcher(&self) -> DfaMatcher {
        DfaMatcher {
            inner: self.inner.clone(),
            state: self.inner.auto.start(),
            ended: false,
        }
    }

    /// The number of live states of a dense automaton (`None` for a lazy one).
    pub fn states(&self) -> Option<usize> {
        self.inner.auto.states()
    }

    /// Whether `text` is a complete output of the constraint.
    pub fn matches(&self, text: &[u8]) -> bool {
        let a = &self.inner.auto;
        matches!(a.run(a.start(), text), Ok(Some(s)) if a.accepting(s).unwrap_or(false))
    }
}

/// One sequence's place in its [`DfaConstraint`].
#[derive(Clone)]
pub struct DfaMatcher {
    inner: Arc<Compiled>,
    state: State,
    /// EOS was accepted.
    ended: bool,
}

impl std::fmt::Debug for DfaMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DfaMatcher({:?})", self.state)
    }
}

impl DfaMatcher {
    /// The tokens allowed next as a bit set (token `i` is bit `i % 32` of word `i / 32`),
    /// computed on the first visit of the automaton's state and cached in the constraint.
    pub fn allowed(&self) -> Result<Arc<[u32]>> {
        if self.ended {
            return Err(Error::InvalidInput(
                "constraint: the output has ended".into(),
            ));
        }
        let c = &self.inner;
        c.auto.allowed(self.state, &c.tokens, &c.chars)
    }

    /// Sets the logits of every token the constraint does not allow next to -inf (`logits`
    /// holds the model's whole vocabulary; ids past the vocabulary are never allowed).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        super::apply_mask(&self.allowed()?, self.inner.tokens.n_vocab, logits);
        Ok(())
    }

    /// Follows the chosen token; a token the constraint does not allow is an error (and the
    /// matcher stays where it was).
    pub fn accept(&mut self, token: u32) -> Result<()> {
        let refuse = || Error::InvalidInput(format!("constraint: token {token} is not allowed"));
        if self.ended {
            return Err(refuse());
        }
        let c = &self.inner;
        if token == c.tokens.eos {
            if !c.auto.accepting(self.state)? {
                return Err(refuse());
            }
            self.ended = true;
            return Ok(());
        }
        let bytes = c.tokens.token(token).ok_or_else(refuse)?;
        self.state = c.auto.run(self.state, bytes)?.ok_or_else(refuse)?;
        Ok(())
    }

    /// Whether the output so far is complete (EOS would be allowed).
    pub fn is_accepting(&self) -> bool {
        !self.ended && self.inner.auto.accepting(self.state).unwrap_or(false)
    }

    /// Whether the constraint is complete and allows nothing more (an accepting state with no
    /// live continuation, or EOS accepted).
    pub fn is_done(&self) -> bool {
        self.ended || self.inner.auto.is_final(self.state).unwrap_or(false)
    }
}
