//! MPNet (all-mpnet-base-v2): a BERT-shaped post-LayerNorm encoder without token types, with
//! RoBERTa-style position ids and a learned relative-position attention bias (T5-style
//! buckets) shared by all layers.
//!
//! Mirrors `transformers/models/mpnet/modeling_mpnet.py` (`MPNetModel`).

use std::path::Path;

use serde::Deserialize;

use super::layers::{position_ids, LayerDims, LayerNames, PostNormLayer};
use super::source::Placement;
use super::{Encoder, EncoderInfo, PackedBatch};
use crate::attention::PositionBias;
use crate::io::store::{Scope, WeightStore};
use crate::ops::{Embedding, LayerNorm};
use crate::tensor::Tensor;
use crate::{Error, Result};

fn default_eps() -> f64 {
    1e-5
}
fn default_buckets() -> usize {
    32
}
fn default_act() -> String {
    "gelu".into()
}
fn default_pad() -> usize {
    1
}

/// `config.json` of an MPNet model.
#[derive(Debug, Clone, Deserialize)]
pub struct MpnetConfig {
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Feed-forward width.
    pub intermediate_size: usize,
    /// Feed-forward activation (only exact `gelu`).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Rows of the position table (positions start at `pad_token_id + 1`).
    pub max_position_embeddings: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Rows of the relative attention bias table.
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
    /// Padding id (also the position-numbering offset).
    #[serde(default = "default_pad")]
    pub pad_token_id: usize,
}

impl MpnetConfig {
    /// Checks the fields the code relies on.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        if self.hidden_act != "gelu" {
            return Err(bad(format!(
                "hidden_act `{}` is not supported (only exact `gelu`)",
                self.hidden_act
            )));
        }
        if self.pad_token_id + 1 >= self.max_position_embeddings {
            return Err(bad(
                "max_position_embeddings leaves no usable position".into()
            ));
        }
        if self.relative_attention_num_buckets < 4 {
            return Err(bad(
                "relative_attention_num_buckets must be at least 4".into()
            ));
        }
        Ok(())
    }
}

/// Tensor names of an MPNet layer under `encoder.layer.N`.
const LAYER_NAMES: LayerNames = LayerNames {
    query: "attention.attn.q",
    key: "attention.attn.k",
    value: "attention.attn.v",
    attn_output: "attention.attn.o",
    attn_norm: "attention.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
};

/// The bucket of a relative position `j - i` (bidirectional, T5 style), computed in f32 as
/// transformers does: exact buckets for small distances, log-spaced up to `max_distance`.
pub fn relative_position_bucket(
    relative_position: i64,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let half = (num_buckets / 2) as i64;
    let n = -relative_position;
    let mut ret = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        ret += n;
    } else {
        let ratio = (n as f32 / max_exact as f32).ln()
            / ((max_distance as f64 / max_exact as f64).ln() as f32)
            * (half - max_exact) as f32;
        ret += (max_exact + ratio as i64).min(half - 1);
    }
    ret as usize
}

/// The MPNet encoder.
#[derive(Debug)]
pub struct MpnetModel {
    info: EncoderInfo,
    n_heads: usize,
    word_embeddings: Embedding,     // f32 [vocab_size, hidden]
    position_embeddings: Embedding, // f32 [max_position_embeddings, hidden]
    embeddings_norm: LayerNorm,
    relative_attention_bias: Embedding, // f32 [num_buckets, n_heads]
    layers: Vec<PostNormLayer>,
    pad_id: u32,
}

impl MpnetModel {
    /// Loads the encoder from `store` (bare names, or under `mpnet.` when saved with a head),
    /// its layers' matrices held as `place` says (CPU).
    pub fn load(store: &WeightStore, cfg: &MpnetConfig, place: &Placement) -> Result<Self> {
        let prefix = if store.contains("embeddings.word_embeddings.weight") {
            ""
        } else {
            "mpnet"
        };
        Self::load_scoped(&store.scope(prefix), cfg, place)
    }

    fn load_scoped(vb: &Scope, cfg: &MpnetConfig, place: &Placement) -> Result<Self> {
        let h = cfg.hidden_size;
        let dims = LayerDims {
            hidden: h,
            intermediate: cfg.intermediate_size,
            n_heads: cfg.num_attention_heads,
            eps: cfg.layer_norm_eps as f32,
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                PostNormLayer::load(
                    &vb.pp(&format!("encoder.layer.{i}")),
                    &LAYER_NAMES,
                    dims,
                    place,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let emb = vb.pp("embeddings");
        Ok(Self {
            info: EncoderInfo {
                model_type: "mpnet".into(),
                hidden_size: h,
                max_positions: cfg.max_position_embeddings - cfg.pad_token_id - 1,
                n_layers: cfg.num_hidden_layers,
                intermediate_size: cfg.intermediate_size,
            },
            n_heads: cfg.num_attention_heads,
            word_embeddings: Embedding::load(&emb.pp("word_embeddings"), cfg.vocab_size, h)?,
            position_embeddings: Embedding::load(
                &emb.pp("position_embeddings"),
                cfg.max_position_embeddings,
                h,
            )?,
            embeddings_norm: LayerNorm::load(&emb.pp("LayerNorm"), h, cfg.layer_norm_eps as f32)?,
            relative_attention_bias: Embedding::load(
                &vb.pp("encoder.relative_attention_bias"),
                cfg.relative_attention_num_buckets,
                cfg.num_attention_heads,
            )?,
            layers,
            pad_id: cfg.pad_token_id as u32,
        })
    }

    /// The attention bias for sequences of up to `max_len` tokens: f32 [n_heads, max_len,
    /// max_len]. transformers computes it once per forward with `num_buckets = 32`.
    fn position_bias(&self, max_len: usize) -> Result<PositionBias> {
        let nh = self.n_heads;
        let mut values = vec![0.0f32; nh * max_len * max_len];
        for i in 0..max_len {
            for j in 0..max_len {
                let bucket = relative_position_bucket(j as i64 - i as i64, 32, 128);
                let row = self.relative_attention_bias.row(bucket)?;
                for (h, &v) in row.iter().enumerate() {
                    values[h * max_len * max_len + i * max_len + j] = v;
                }
            }
        }
        Ok(PositionBias { values, max_len })
    }
}

impl Encoder for MpnetModel {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn forward_on_pool(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        batch.validate(self.info.max_positions)?;
        let h = self.info.hidden_size;
        let mut x = vec![0.0f32; batch.n_tokens() * h];
        self.word_embeddings
            .add_rows(batch.ids.iter().map(|&i| i as usize), &mut x)?;
        let positions = position_ids(&batch.ids, &batch.cu_seqlens, Some(self.pad_id));
        self.position_embeddings.add_rows(positions, &mut x)?;
        self.embeddings_norm.forward_inplace(&mut x);
        let bias = self.position_bias(batch.max_len())?;
        let width = self.info.hidden_size;
        let mut t = Tensor::cpu(x.len() / width.max(1), width, x);
        for layer in &self.layers {
            t = layer.forward(t, &batch.cu_seqlens, Some(&bias))?;
        }
        t.into_host()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_transformers_table() {
        // Values produced by transformers' MPNetEncoder.relative_position_bucket for
        // relative positions -200..=200 step 25 (num_buckets 32, max_distance 128).
        let rel: Vec<i64> = (-8..=8).map(|k| k * 25).collect();
        let got: Vec<usize> = rel
            .iter()
            .map(|&r| relative_position_bucket(r, 32, 128))
            .collect();
        let want = [
            15, 15, 15, 15, 15, 14, 13, 11, 0, 27, 29, 30, 31, 31, 31, 31, 31,
        ];
        assert_eq!(got, want);
        // Every relative position in -600..=600, against the table dumped from transformers.
        let table: Vec<usize> =
            serde_json::from_str(include_str!("../../tests/data/mpnet_buckets.json")).unwrap();
        for (k, &b) in table.iter().enumerate() {
            assert_eq!(
                relative_position_bucket(k as i64 - 600, 32, 128),
                b,
                "rel {}",
                k as i64 - 600
            );
        }
    }
}
