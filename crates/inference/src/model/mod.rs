//! Model architectures, one file each, written as calls to [`crate::ops`] and
//! [`crate::attention`]; plus [`heads`] (pooling, classification) shared by them.
//!
//! Encoders take a [`PackedBatch`] (the tokens of all sequences back to back, no padding) and
//! return the last hidden state of every token. [`load_encoder`] picks the architecture from
//! `config.json`'s `model_type`.
//!
//! Decoders ([`decoder::Decoder`]: Llama, Qwen2, Qwen3 in [`llama`]) extend per-sequence KV
//! caches and return logits; [`decoder::load_decoder`] reads a model folder or a GGUF file
//! through [`source::TensorSource`].

pub mod bert;
pub mod decoder;
pub mod heads;
pub mod layers;
pub mod llama;
pub mod mpnet;
pub mod qwen35;
pub mod source;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::io::store::WeightStore;
use crate::{Error, Result};

/// A batch of sequences packed back to back.
#[derive(Debug, Clone, Default)]
pub struct PackedBatch {
    /// Token ids of all sequences, concatenated. u32 [n_tokens]
    pub ids: Vec<u32>,
    /// Segment (token type) ids, parallel to `ids`. u32 [n_tokens]
    pub type_ids: Vec<u32>,
    /// Sequence `i` owns tokens `cu_seqlens[i]..cu_seqlens[i + 1]`. [n_seqs + 1]
    pub cu_seqlens: Vec<usize>,
}

impl PackedBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self {
            ids: Vec::new(),
            type_ids: Vec::new(),
            cu_seqlens: vec![0],
        }
    }

    /// Appends one sequence. `type_ids` may be empty (all zeros).
    pub fn push(&mut self, ids: &[u32], type_ids: &[u32]) {
        if self.cu_seqlens.is_empty() {
            self.cu_seqlens.push(0);
        }
        self.ids.extend_from_slice(ids);
        if type_ids.len() == ids.len() {
            self.type_ids.extend_from_slice(type_ids);
        } else {
            self.type_ids.extend(std::iter::repeat_n(0, ids.len()));
        }
        self.cu_seqlens.push(self.ids.len());
    }

    /// Number of sequences.
    pub fn n_seqs(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Number of tokens over all sequences.
    pub fn n_tokens(&self) -> usize {
        self.ids.len()
    }

    /// Length of the longest sequence.
    pub fn max_len(&self) -> usize {
        self.cu_seqlens
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    /// Checks the batch against a model's limits: non-empty sequences no longer than
    /// `max_len` tokens.
    pub fn validate(&self, max_len: usize) -> Result<()> {
        crate::attention::check_cu_seqlens(&self.cu_seqlens, self.ids.len())?;
        for (i, w) in self.cu_seqlens.windows(2).enumerate() {
            let len = w[1] - w[0];
            if len == 0 {
                return Err(Error::InvalidInput(format!("sequence {i} has no tokens")));
            }
            if len > max_len {
                return Err(Error::InvalidInput(format!(
                    "sequence {i} has {len} tokens; the model takes at most {max_len} (truncate it)"
                )));
            }
        }
        Ok(())
    }
}

/// What callers need to know about an encoder.
#[derive(Debug, Clone)]
pub struct EncoderInfo {
    /// `config.json` `model_type`.
    pub model_type: String,
    /// Width of each token's hidden state.
    pub hidden_size: usize,
    /// Longest sequence (in tokens, special tokens included) the position table allows.
    pub max_positions: usize,
    /// Number of transformer layers.
    pub n_layers: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
}

impl EncoderInfo {
    /// Floating-point operations (multiply and add counted separately) of one forward pass over
    /// `batch`: the dense layers plus the attention products of each sequence.
    pub fn forward_flops(&self, batch: &PackedBatch) -> f64 {
        let (h, i) = (self.hidden_size as f64, self.intermediate_size as f64);
        let tokens = batch.n_tokens() as f64;
        let dense = 2.0 * tokens * (4.0 * h * h + 2.0 * h * i);
        let attn: f64 = batch
            .cu_seqlens
            .windows(2)
            .map(|w| {
                let l = (w[1] - w[0]) as f64;
                4.0 * l * l * h
            })
            .sum();
        self.n_layers as f64 * (dense + attn)
    }
}

/// A text encoder: token ids in, one hidden state per token out.
pub trait Encoder: Send + Sync {
    /// Shape facts about the model.
    fn info(&self) -> &EncoderInfo;
    /// Last hidden state of every token: f32 [batch.n_tokens(), hidden_size].
    fn forward(&self, batch: &PackedBatch) -> Result<Vec<f32>>;
}

/// Reads and parses `dir/config.json`.
pub fn read_config<T: DeserializeOwned>(dir: &Path) -> Result<(T, PathBuf)> {
    let path = dir.join("config.json");
    if !path.is_file() {
        return Err(Error::InvalidConfig {
            path: path.clone(),
            reason: "file not found (is this a model directory?)".into(),
        });
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let cfg = serde_json::from_str(&text).map_err(|e| Error::InvalidConfig {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok((cfg, path))
}

#[derive(serde::Deserialize)]
struct ModelTypeOnly {
    model_type: Option<String>,
}

/// Loads the encoder in `dir` (config.json + safetensors), choosing the architecture from
/// `model_type`: `bert`, `roberta`, `xlm-roberta`, `mpnet`, or a decoder used as an encoder
/// (`qwen3` for Qwen3-Embedding, `qwen2`, `llama`, `mistral`).
pub fn load_encoder(dir: &Path) -> Result<Box<dyn Encoder>> {
    let (probe, path): (ModelTypeOnly, _) = read_config(dir)?;
    let model_type = probe.model_type.ok_or_else(|| Error::InvalidConfig {
        path: path.clone(),
        reason: "missing `model_type`".into(),
    })?;
    match model_type.as_str() {
        "bert" | "roberta" | "xlm-roberta" => {
            let (cfg, path) = read_config::<bert::BertConfig>(dir)?;
            cfg.validate(&path)?;
            let store = WeightStore::open_dir(dir)?;
            Ok(Box::new(bert::BertModel::load(&store, &cfg)?))
        }
        "mpnet" => {
            let (cfg, path) = read_config::<mpnet::MpnetConfig>(dir)?;
            cfg.validate(&path)?;
            let store = WeightStore::open_dir(dir)?;
            Ok(Box::new(mpnet::MpnetModel::load(&store, &cfg)?))
        }
        // Decoder-only embedding models (Qwen3-Embedding): the decoder without its head.
        "qwen3" | "qwen2" | "llama" | "mistral" => {
            let source = source::TensorSource::open(dir)?;
            let cfg = source.decoder_config()?;
            Ok(Box::new(llama::LlamaModel::load(
                cfg,
                &source,
                source::WeightMode::F32,
                false,
            )?))
        }
        other => Err(Error::UnsupportedModel(format!(
            "model_type `{other}` in {} (supported encoders: bert, roberta, xlm-roberta, mpnet, qwen3, qwen2, llama, mistral)",
            path.display()
        ))),
    }
}
