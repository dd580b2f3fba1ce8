//! [`Reranker`]: a cross-encoder that scores (query, passage) pairs, as sentence-transformers'
//! `CrossEncoder(dir).predict(pairs)`: the pair is tokenized as `[CLS] query [SEP] passage
//! [SEP]` (longest-first truncation to the model's limit), run through
//! `BertForSequenceClassification`, and the logit passed through the model's activation
//! (sigmoid for single-label models unless the config names another).

use std::path::Path;

use lattice_inference::backend::Device;
use lattice_inference::model::bert::BertForSequenceClassification;
use lattice_inference::model::source::{Placement, WeightMode};
use lattice_inference::model::PackedBatch;
use lattice_inference::tokenizer::Tokenizer;

use crate::{Error, Result};

/// The function applied to a logit to give the score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// The raw logit.
    Identity,
}

/// A loaded cross-encoder.
pub struct Reranker {
    tokenizer: Tokenizer,
    model: BertForSequenceClassification,
    max_tokens: usize,
    activation: Activation,
    max_batch_tokens: usize,
}

impl std::fmt::Debug for Reranker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reranker")
            .field("max_tokens", &self.max_tokens)
            .field("activation", &self.activation)
            .finish()
    }
}

#[derive(serde::Deserialize, Default)]
struct StSection {
    activation_fn: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct RerankConfigExtras {
    #[serde(default)]
    sentence_transformers: Option<StSection>,
}

#[derive(serde::Deserialize, Default)]
struct TokenizerConfig {
    model_max_length: Option<f64>,
}

impl Reranker {
    /// Loads the cross-encoder in `dir` (config.json, model.safetensors, tokenizer).
    pub fn load_dir(dir: &Path) -> Result<Reranker> {
        Self::load_dir_with(dir, WeightMode::F32)
    }

    /// [`Reranker::load_dir`] with the encoder's matrices held as `mode` says
    /// ([`WeightMode::F32`], [`WeightMode::Bf16`] or [`WeightMode::Q8`]; see
    /// [`crate::EmbedderOptions::mode`]).
    pub fn load_dir_with(dir: &Path, mode: WeightMode) -> Result<Reranker> {
        let place = Placement::new(mode, Device::Cpu);
        let model = BertForSequenceClassification::load_dir_with(dir, &place)?;
        let tokenizer = Tokenizer::from_dir(dir)?;
        let cfg_path = dir.join("config.json");
        let extras: RerankConfigExtras = std::fs::read_to_string(&cfg_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let activation = match extras
            .sentence_transformers
            .and_then(|s| s.activation_fn)
            .as_deref()
        {
            None if model.num_labels() == 1 => Activation::Sigmoid,
            None => Activation::Identity,
            Some(s) if s.ends_with("Sigmoid") => Activation::Sigmoid,
            Some(s) if s.ends_with("Identity") => Activation::Identity,
            Some(other) => {
                return Err(Error::InvalidConfig {
                    path: cfg_path,
                    reason: format!("activation_fn `{other}` is not supported (Sigmoid, Identity)"),
                })
            }
        };
        let tok_cfg: TokenizerConfig = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let positions = model.info().max_positions;
        let max_tokens = tok_cfg
            .model_max_length
            .filter(|&m| m >= 1.0 && m < positions as f64)
            .map_or(positions, |m| m as usize);
        Ok(Reranker {
            tokenizer,
            model,
            max_tokens,
            activation,
            max_batch_tokens: 16_384,
        })
    }

    /// The tokenizer (query and passage pairs).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The activation applied by [`Reranker::scores`].
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Raw first-label logits of each (query, passage) pair.
    pub fn logits(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        Ok(self.logits_with_tokens(query, passages)?.0)
    }

    /// [`Reranker::logits`] and the number of tokens run (all pairs, special tokens included).
    pub fn logits_with_tokens(&self, query: &str, passages: &[&str]) -> Result<(Vec<f32>, usize)> {
        let mut encodings = Vec::with_capacity(passages.len());
        for p in passages {
            encodings.push(
                self.tokenizer
                    .encode_with(query, Some(p), true, Some(self.max_tokens)),
            );
        }
        let n_labels = self.model.num_labels();
        let mut out = Vec::with_capacity(passages.len());
        let mut start = 0;
        while start < encodings.len() {
            let mut batch = PackedBatch::new();
            let mut end = start;
            while end < encodings.len()
                && (end == start
                    || batch.n_tokens() + encodings[end].ids.len() <= self.max_batch_tokens)
            {
                batch.push(&encodings[end].ids, &encodings[end].type_ids);
                end += 1;
            }
            let logits = self.model.forward(&batch)?;
            out.extend(logits.chunks_exact(n_labels).map(|l| l[0]));
            start = end;
        }
        let tokens = encodings.iter().map(|e| e.ids.len()).sum();
        Ok((out, tokens))
    }

    /// Applies the model's activation to raw logits in place (what [`Reranker::scores`] does).
    pub fn activate(&self, logits: &mut [f32]) {
        if self.activation == Activation::Sigmoid {
            for v in logits {
                *v = 1.0 / (1.0 + (-*v).exp());
            }
        }
    }

    /// Scores of each (query, passage) pair after the model's activation.
    pub fn scores(&self, query: &str, passages: &[&str]) -> Result<Vec<f32>> {
        let mut s = self.logits(query, passages)?;
        self.activate(&mut s);
        Ok(s)
    }
}
