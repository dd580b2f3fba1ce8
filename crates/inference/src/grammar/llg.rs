//! The llguidance engine: every [`Spec`] compiled by the `llguidance` crate (an Earley parser
//! over a lexer of derivative-based regular expressions) over a model's vocabulary. What
//! [`super::Vocabulary`] serves any JSON object, Lark and GBNF grammars with, and the JSON
//! Schemas and regular expressions the DFA engine (`grammar/dfa/`) refuses. This module owns
//! the translation of specs into llguidance grammars (compact JSON layout, GBNF through
//! `gbnf.rs`), the vocabulary (token bytes from our tokenizers, special tokens marked) and the
//! errors.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::ParserFactory;
use serde_json::Value;

use super::{gbnf, Spec};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

/// JSON is written compactly with one space after `,` and `:` (as `json.dumps` writes it, and
/// as the DFA engine writes it): with free whitespace a model can loop on blanks and never
/// finish (seen on random weights). A schema's own `x-guidance` options win.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(compact_options);
    }
    schema
}

/// llguidance's options (`x-guidance`) for the compact layout [`compact`] asks for.
pub(super) fn compact_options() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": "
    })
}

/// The llguidance grammar of `spec`.
fn grammar(spec: &Spec) -> Result<TopLevelGrammar> {
    Ok(match spec {
        Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
        Spec::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
        }
        Spec::Regex(r) => TopLevelGrammar::from_regex(r),
        Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        Spec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf::to_lark(g)?),
    })
}

/// The byte strings of the `n_vocab` tokens of `tokenizer` as llguidance reads them: special
/// tokens marked (so that constraints never spell text with them), ids past the tokenizer's
/// empty.
pub fn words(tokenizer: &Tokenizer, n_vocab: usize) -> Vec<Vec<u8>> {
    (0..n_vocab as u32)
        .map(|id| match tokenizer.token_bytes(id) {
            Some((bytes, true)) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(&bytes);
                w
            }
            Some((bytes, false)) => bytes,
            None => Vec::new(),
        })
        .collect()
}

/// A model's vocabulary for llguidance (every token's bytes in llguidance's trie, built once
/// per model), and the compiler of [`Spec`]s over it.
pub struct LlgVocabulary {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for LlgVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LlgVocabulary({} tokens)", self.n_vocab)
    }
}

impl LlgVocabulary {
    /// The vocabulary of `tokenizer` for a model with `n_vocab` logits (ids past the
    /// tokenizer's are never allowed); `eos` ends a completed constraint.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize, eos: u32) -> Result<Self> {
        Self::from_words(&words(tokenizer, n_vocab), eos)
    }

    /// The vocabulary of the token byte strings `words` (one per logit, as [`words`] reads
    /// them); `eos` ends a completed constraint.
    pub fn from_words(words: &[Vec<u8>], eos: u32) -> Result<Self> {
        let n_vocab = words.len();
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let env: Arc<dyn TokenizerEnv + Sync> =
            Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, words)));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::InvalidInput(format!("grammar vocabulary: {e}")))?;
        factory.quiet();
        Ok(Self { factory, n_vocab })
    }

    /// Compiles `spec`; an unsupported feature or an invalid schema, expression or grammar is
    /// an error naming it (and the spec's kind, [`Spec::kind`]).
    pub fn compile(&self, spec: &Spec) -> Result<LlgConstraint> {
        let parser = self
            .factory
            .create_parser(grammar(spec)?)
            .map_err(|e| Error::InvalidInput(format!("invalid {}: {e}", spec.kind())))?;
        Ok(LlgConstraint {
            parser,
            n_vocab: self.n_vocab,
        })
    }
}

/// A spec compiled by llguidance; each sequence that follows it takes its own [`LlgMatcher`].
#[derive(Clone)]
pub struct LlgConstraint {
    parser: llguidance::TokenParser,
    n_vocab: usize,
}

impl std::fmt::Debug for LlgConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LlgConstraint")
    }
}

impl LlgConstraint {
    /// A matcher at the start of the output.
    pub fn matcher(&self) -> LlgMatcher {
        LlgMatcher {
            inner: llguidance::Matcher::new(Ok(self.parser.clone())),
            n_vocab: self.n_vocab,
        }
    }
}

/// One sequence's place in its [`LlgConstraint`].
pub struct LlgMatcher {
    inner: llguidance::Matcher,
    n_vocab: usize,
}

impl std::fmt::Debug for LlgMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LlgMatcher")
    }
}

impl LlgMatcher {
    /// Sets the logits of every token the constraint does not allow next to -inf (`logits`
    /// holds the model's whole vocabulary; ids past the vocabulary are never allowed).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let allowed = self
            .inner
            .compute_mask()
            .map_err(|e| Error::InvalidInput(format!("constraint: {e}")))?;
        super::apply_mask(allowed.as_slice(), self.n_vocab, logits);
        Ok(())
    }

    /// Follows the chosen token.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.inner
            .consume_token(token)
            .map_err(|e| Error::InvalidInput(format!("constraint: token {token}: {e}")))
    }

    /// Whether the constraint is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        self.inner.is_stopped()
    }

    /// How many of `tokens`, in order from here, the constraint allows (the matcher does not
    /// move; 0 when llguidance cannot tell).
    pub fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        self.inner.validate_tokens(tokens).unwrap_or(0)
    }
}
