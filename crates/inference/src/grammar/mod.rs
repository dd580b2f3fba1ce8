//! Output constraints: what a request may generate (a JSON Schema, any JSON object, a regular
//! expression or a Lark grammar), compiled over a model's vocabulary into a per-sequence
//! [`Matcher`] that masks the logits of every step to the tokens the constraint allows and
//! follows the tokens chosen. Compilation and masks come from the `llguidance` crate (its
//! published figures meet issue 14's bar: ~1 ms compile, 47 µs mean per mask on 10k schemas);
//! this module owns the vocabulary (token bytes from our tokenizers) and the errors.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::ParserFactory;
use serde_json::Value;

use crate::tokenizer::Tokenizer;
use crate::{Error, Result};

pub mod gbnf;

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

/// JSON is written compactly with one space after `,` and `:` (as `json.dumps` writes it):
/// with free whitespace a model can loop on blanks and never finish (seen on random weights).
/// A schema's own `x-guidance` options win.
fn compact(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": "
            })
        });
    }
    schema
}

impl Spec {
    fn grammar(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Spec::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
            Spec::JsonObject => {
                TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
            }
            Spec::Regex(r) => TopLevelGrammar::from_regex(r),
            Spec::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
            Spec::Gbnf(g) => TopLevelGrammar::from_lark(gbnf::to_lark(g)?),
        })
    }

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

/// A model's vocabulary as constraints see it (built once per model: every token's bytes in a
/// trie), and the compiler of [`Spec`]s over it.
pub struct Vocabulary {
    factory: ParserFactory,
    n_vocab: usize,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vocabulary({} tokens)", self.n_vocab)
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` for a model with `n_vocab` logits (ids past the
    /// tokenizer's are never allowed); `eos` ends a completed constraint.
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize, eos: u32) -> Result<Self> {
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| match tokenizer.token_bytes(id) {
                // Special tokens are marked so that constraints never spell text with them.
                Some((bytes, true)) => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(&bytes);
                    w
                }
                Some((bytes, false)) => bytes,
                None => Vec::new(),
            })
            .collect();
        let info = TokRxInfo::new(n_vocab as u32, eos);
        let env: Arc<dyn TokenizerEnv + Sync> =
            Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::InvalidInput(format!("grammar vocabulary: {e}")))?;
        factory.quiet();
        Ok(Self { factory, n_vocab })
    }

    /// Compiles `spec`; an unsupported feature or an invalid schema, expression or grammar is
    /// an error naming it.
    pub fn compile(&self, spec: &Spec) -> Result<Constraint> {
        let parser = self
            .factory
            .create_parser(spec.grammar()?)
            .map_err(|e| Error::InvalidInput(format!("invalid {}: {e}", spec.kind())))?;
        Ok(Constraint {
            parser,
            n_vocab: self.n_vocab,
        })
    }
}

/// A compiled constraint; each sequence that follows it takes its own [`Matcher`].
#[derive(Clone)]
pub struct Constraint {
    parser: llguidance::TokenParser,
    n_vocab: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    /// A matcher at the start of the output.
    pub fn matcher(&self) -> Matcher {
        Matcher {
            inner: llguidance::Matcher::new(Ok(self.parser.clone())),
            n_vocab: self.n_vocab,
        }
    }
}

/// One sequence's place in its constraint.
pub struct Matcher {
    inner: llguidance::Matcher,
    n_vocab: usize,
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
        let allowed = self
            .inner
            .compute_mask()
            .map_err(|e| Error::InvalidInput(format!("constraint: {e}")))?;
        // 32 tokens per word of the bit set: whole words allowed are skipped.
        let words = allowed.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX && (w + 1) * 32 <= self.n_vocab {
                continue;
            }
            if bits == 0 {
                chunk.fill(f32::NEG_INFINITY);
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if bits >> j & 1 == 0 || w * 32 + j >= self.n_vocab {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
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
}
