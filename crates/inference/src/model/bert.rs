//! BERT (and RoBERTa / XLM-R, which differ only in where position ids start): the encoder behind
//! MiniLM, BGE and E5; plus `BertForSequenceClassification` for cross-encoder rerankers.
//!
//! Mirrors `transformers/models/bert/modeling_bert.py`: embeddings (word + token type +
//! absolute position, LayerNorm), then per layer self-attention → dense → residual + LayerNorm,
//! intermediate dense → exact GELU → dense → residual + LayerNorm.

use std::path::Path;

use serde::Deserialize;

use super::layers::{position_ids, LayerDims, LayerNames, PostNormLayer};
use super::source::Placement;
use super::{Encoder, EncoderInfo, PackedBatch};
use crate::backend::Device;
use crate::io::store::{Scope, WeightStore};
use crate::ops::{self, Embedding, LayerNorm, Linear};
use crate::tensor::Tensor;
use crate::{Error, Result};

fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_pos_type() -> String {
    "absolute".into()
}

/// `config.json` of a BERT-family model (field names as in the file).
#[derive(Debug, Clone, Deserialize)]
pub struct BertConfig {
    /// `bert`, `roberta` or `xlm-roberta`.
    pub model_type: String,
    /// Rows of the word embedding table.
    pub vocab_size: usize,
    /// Hidden width.
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_hidden_layers: usize,
    /// Attention heads per layer.
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Activation of the feed-forward layer (only exact `gelu` is supported).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Rows of the position embedding table.
    pub max_position_embeddings: usize,
    /// Rows of the token type table.
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Only `absolute` is supported.
    #[serde(default = "default_pos_type")]
    pub position_embedding_type: String,
    /// Padding id; RoBERTa-style models start positions at `pad_token_id + 1`.
    #[serde(default)]
    pub pad_token_id: usize,
    /// Labels of a classification head (`id2label`), if any.
    #[serde(default)]
    pub id2label: Option<std::collections::BTreeMap<String, String>>,
}

impl BertConfig {
    /// Checks the fields the code relies on.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        if self.hidden_size == 0 || self.num_attention_heads == 0 || self.num_hidden_layers == 0 {
            return Err(bad(
                "hidden_size, num_attention_heads and num_hidden_layers must be > 0".into(),
            ));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
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
        if self.position_embedding_type != "absolute" {
            return Err(bad(format!(
                "position_embedding_type `{}` is not supported (only `absolute`)",
                self.position_embedding_type
            )));
        }
        if self.position_offset() >= self.max_position_embeddings {
            return Err(bad(
                "max_position_embeddings leaves no usable position".into()
            ));
        }
        Ok(())
    }

    /// Position id of a sequence's first token: 0 for BERT, `pad_token_id + 1` for RoBERTa.
    pub fn position_offset(&self) -> usize {
        match self.model_type.as_str() {
            "roberta" | "xlm-roberta" => self.pad_token_id + 1,
            _ => 0,
        }
    }

    /// Number of classification labels (1 when the config names none).
    pub fn num_labels(&self) -> usize {
        self.id2label.as_ref().map_or(1, |m| m.len().max(1))
    }
}

/// Word + position + token-type embeddings followed by LayerNorm.
#[derive(Debug)]
struct BertEmbeddings {
    word_embeddings: Embedding,               // f32 [vocab_size, hidden]
    position_embeddings: Embedding,           // f32 [max_position_embeddings, hidden]
    token_type_embeddings: Option<Embedding>, // f32 [type_vocab_size, hidden]
    layer_norm: LayerNorm,
    pad_id: Option<u32>, // RoBERTa-style position numbering when set
}

impl BertEmbeddings {
    fn load(vb: &Scope, cfg: &BertConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let token_type_embeddings = if vb.contains("token_type_embeddings.weight") {
            Some(Embedding::load(
                &vb.pp("token_type_embeddings"),
                cfg.type_vocab_size,
                h,
            )?)
        } else {
            None
        };
        Ok(Self {
            word_embeddings: Embedding::load(&vb.pp("word_embeddings"), cfg.vocab_size, h)?,
            position_embeddings: Embedding::load(
                &vb.pp("position_embeddings"),
                cfg.max_position_embeddings,
                h,
            )?,
            token_type_embeddings,
            layer_norm: LayerNorm::load(&vb.pp("LayerNorm"), h, cfg.layer_norm_eps as f32)?,
            pad_id: (cfg.position_offset() > 0).then_some(cfg.pad_token_id as u32),
        })
    }

    /// f32 [n_tokens, hidden]
    fn forward(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        let h = self.word_embeddings.dim();
        let mut x = vec![0.0f32; batch.n_tokens() * h];
        self.word_embeddings
            .add_rows(batch.ids.iter().map(|&i| i as usize), &mut x)?;
        if let Some(tt) = &self.token_type_embeddings {
            tt.add_rows(batch.type_ids.iter().map(|&i| i as usize), &mut x)?;
        }
        let positions = position_ids(&batch.ids, &batch.cu_seqlens, self.pad_id);
        self.position_embeddings.add_rows(positions, &mut x)?;
        self.layer_norm.forward_inplace(&mut x);
        Ok(x)
    }
}

/// Tensor names of a BERT layer under `encoder.layer.N`.
const LAYER_NAMES: LayerNames = LayerNames {
    query: "attention.self.query",
    key: "attention.self.key",
    value: "attention.self.value",
    attn_output: "attention.output.dense",
    attn_norm: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
};

/// The BERT encoder (no pooler: heads live in [`super::heads`] and
/// [`BertForSequenceClassification`]).
#[derive(Debug)]
pub struct BertModel {
    info: EncoderInfo,
    embeddings: BertEmbeddings,
    layers: Vec<PostNormLayer>,
    /// Where the layers run (the embeddings are looked up on the host).
    device: Device,
}

/// The scope the encoder's tensors live under: bare names (as sentence-transformers saves a
/// `BertModel`), or under `bert.` / `roberta.` when saved with a task head.
fn encoder_scope<'a>(store: &'a WeightStore, cfg: &BertConfig) -> Scope<'a> {
    let probe = "embeddings.word_embeddings.weight";
    let own = cfg.model_type.replace('-', "_");
    let prefix = ["", "bert", "roberta", own.as_str()]
        .into_iter()
        .find(|p| store.scope(p).contains(probe))
        .unwrap_or("");
    store.scope(prefix)
}

impl BertModel {
    /// Loads the encoder from `store`, under whichever prefix the checkpoint uses, its layers'
    /// matrices held and placed as `place` says.
    pub fn load(store: &WeightStore, cfg: &BertConfig, place: &Placement) -> Result<Self> {
        Self::load_scoped(&encoder_scope(store, cfg), cfg, place)
    }

    fn load_scoped(vb: &Scope, cfg: &BertConfig, place: &Placement) -> Result<Self> {
        let dims = LayerDims {
            hidden: cfg.hidden_size,
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
        Ok(Self {
            info: EncoderInfo {
                model_type: cfg.model_type.clone(),
                hidden_size: cfg.hidden_size,
                max_positions: cfg.max_position_embeddings - cfg.position_offset(),
                n_layers: cfg.num_hidden_layers,
                intermediate_size: cfg.intermediate_size,
            },
            embeddings: BertEmbeddings::load(&vb.pp("embeddings"), cfg)?,
            layers,
            device: place.device.clone(),
        })
    }
}

impl Encoder for BertModel {
    fn info(&self) -> &EncoderInfo {
        &self.info
    }

    fn forward_on_pool(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        batch.validate(self.info.max_positions)?;
        let x = self.embeddings.forward(batch)?;
        let width = self.info.hidden_size;
        let mut t = Tensor::from_host(&self.device, x.len() / width.max(1), width, x)?;
        for layer in &self.layers {
            t = layer.forward(t, &batch.cu_seqlens, None)?;
        }
        t.into_host()
    }
}

/// `BertForSequenceClassification`: the encoder, the pooler (dense + tanh on `[CLS]`) and a
/// linear classifier. A cross-encoder reranker scores a `[CLS] query [SEP] passage [SEP]` pair
/// with it.
#[derive(Debug)]
pub struct BertForSequenceClassification {
    bert: BertModel,
    pooler: Linear,     // bert.pooler.dense [hidden, hidden]
    classifier: Linear, // classifier [num_labels, hidden]
}

impl BertForSequenceClassification {
    /// Loads `dir` (config.json + safetensors) as a sequence classifier.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        Self::load_dir_with(
            dir,
            &Placement::new(super::source::WeightMode::F32, Device::Cpu),
        )
    }

    /// [`Self::load_dir`] with the encoder layers' matrices held as `place` says (CPU only;
    /// the pooler and classifier stay f32; `--q8` as [`Placement::for_encoder`] says).
    pub fn load_dir_with(dir: &Path, place: &Placement) -> Result<Self> {
        let place = &place.for_encoder();
        if !place.device.is_cpu() {
            return Err(Error::Device(format!(
                "cross-encoders do not run on {} yet; use the CPU",
                place.device
            )));
        }
        let (cfg, path) = super::read_config::<BertConfig>(dir)?;
        cfg.validate(&path)?;
        if cfg.model_type != "bert" {
            return Err(Error::UnsupportedModel(format!(
                "sequence classification for model_type `{}` (only `bert`)",
                cfg.model_type
            )));
        }
        let store = WeightStore::open_dir(dir)?;
        let vb = encoder_scope(&store, &cfg);
        let h = cfg.hidden_size;
        let classifier = Linear::load(&store.scope("classifier"), h, cfg.num_labels(), true)?;
        Ok(Self {
            bert: BertModel::load_scoped(&vb, &cfg, place)?,
            pooler: Linear::load(&vb.pp("pooler.dense"), h, h, true)?,
            classifier,
        })
    }

    /// The encoder's facts.
    pub fn info(&self) -> &EncoderInfo {
        self.bert.info()
    }

    /// Number of logits per sequence.
    pub fn num_labels(&self) -> usize {
        self.classifier.out_dim()
    }

    /// Logits f32 [n_seqs, num_labels].
    pub fn forward(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        let hidden = self.bert.forward(batch)?;
        let h = self.bert.info.hidden_size;
        let mut cls = super::heads::pool(&hidden, h, &batch.cu_seqlens, super::heads::Pooling::Cls);
        let mut pooled = self.pooler.forward(&cls);
        ops::tanh(&mut pooled);
        cls.clear();
        Ok(self.classifier.forward(&pooled))
    }
}
