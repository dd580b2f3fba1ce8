//! Model architectures, one file each, written as calls to [`crate::ops`] and
//! [`crate::attention`]; plus [`heads`] (pooling, classification) shared by them.
//!
//! Encoders take a [`PackedBatch`] (the tokens of all sequences back to back, no padding) and
//! return the last hidden state of every token. [`load_encoder`] picks the architecture from
//! `config.json`'s `model_type`.
//!
//! Decoders ([`decoder::Decoder`]: Llama, Qwen2, Qwen3 in [`llama`], Qwen3.5 in [`qwen35`],
//! BitNet b1.58 in [`bitnet`])
//! extend per-sequence states and return logits; [`load_decoder`] reads a model folder or a
//! GGUF file through [`source::TensorSource`] and picks the architecture from
//! [`DECODER_FAMILIES`], the registry: a new architecture is one model file plus a row there.

pub mod batch;
pub mod bert;
pub mod bitnet;
pub mod decoder;
pub mod heads;
pub mod hybrid;
pub mod layers;
pub mod llama;
pub mod mpnet;
pub mod qwen35;
pub mod source;
pub mod vision;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::io::store::WeightStore;
use crate::{Error, Result};

use decoder::{Decoder, DecoderArch, DecoderConfig};
use source::{Placement, TensorSource, WeightMode};

/// Builds a decoder of one family from its configuration and weights.
pub type DecoderLoader = fn(DecoderConfig, &TensorSource, &Placement) -> Result<Box<dyn Decoder>>;

/// One row of the decoder registry.
#[derive(Debug)]
pub struct DecoderFamily {
    /// The architecture.
    pub arch: DecoderArch,
    /// `model_type` values of transformers `config.json` files.
    pub hf_model_types: &'static [&'static str],
    /// `general.architecture` values of GGUF files.
    pub gguf_archs: &'static [&'static str],
    /// The loader.
    pub load: DecoderLoader,
}

fn load_llama(c: DecoderConfig, s: &TensorSource, p: &Placement) -> Result<Box<dyn Decoder>> {
    Ok(Box::new(llama::LlamaModel::load(c, s, p, true)?))
}

fn load_bitnet(c: DecoderConfig, s: &TensorSource, p: &Placement) -> Result<Box<dyn Decoder>> {
    Ok(Box::new(bitnet::BitNetModel::load(c, s, p)?))
}

fn load_qwen35(c: DecoderConfig, s: &TensorSource, p: &Placement) -> Result<Box<dyn Decoder>> {
    Ok(Box::new(qwen35::Qwen35Model::load(c, s, p)?))
}

/// The decoder registry.
pub const DECODER_FAMILIES: &[DecoderFamily] = &[
    DecoderFamily {
        arch: DecoderArch::Llama,
        hf_model_types: &["llama", "mistral"],
        gguf_archs: &["llama"],
        load: load_llama,
    },
    DecoderFamily {
        arch: DecoderArch::Qwen2,
        hf_model_types: &["qwen2"],
        gguf_archs: &["qwen2"],
        load: load_llama,
    },
    DecoderFamily {
        arch: DecoderArch::Qwen3,
        hf_model_types: &["qwen3", "qwen3_vl", "qwen3_vl_text"],
        gguf_archs: &["qwen3"],
        load: load_llama,
    },
    DecoderFamily {
        arch: DecoderArch::Qwen35,
        hf_model_types: &["qwen3_5", "qwen3_5_text"],
        gguf_archs: &["qwen35"],
        load: load_qwen35,
    },
    DecoderFamily {
        arch: DecoderArch::BitNet,
        hf_model_types: &["bitnet"],
        gguf_archs: &["bitnet", "bitnet-b1.58", "bitnet-25"],
        load: load_bitnet,
    },
];

/// The registry row of a `model_type` (or, with `gguf`, a GGUF architecture name).
pub fn decoder_family(name: &str, gguf: bool) -> Option<&'static DecoderFamily> {
    DECODER_FAMILIES.iter().find(|f| {
        let names = if gguf { f.gguf_archs } else { f.hf_model_types };
        names.contains(&name)
    })
}

/// The architecture of `name` (a `model_type`, or with `gguf` a GGUF architecture), or an
/// error naming the file and the names the registry accepts.
fn decoder_arch(name: &str, gguf: bool, path: &Path) -> Result<DecoderArch> {
    if let Some(f) = decoder_family(name, gguf) {
        return Ok(f.arch);
    }
    let names: Vec<&str> = DECODER_FAMILIES
        .iter()
        .flat_map(|f| {
            if gguf { f.gguf_archs } else { f.hf_model_types }
                .iter()
                .copied()
        })
        .collect();
    let what = if gguf {
        "GGUF architecture"
    } else {
        "model_type"
    };
    Err(Error::UnsupportedModel(format!(
        "{}: {what} `{name}` is not a supported decoder ({})",
        path.display(),
        names.join(", ")
    )))
}

/// Loads a decoder from a model directory (`config.json` + safetensors) or a `.gguf` file.
///
/// `mode` picks how GGUF weights are held: [`WeightMode::Quantized`] multiplies with the blocks
/// directly; [`WeightMode::F32`] dequantizes everything at load (the reference path).
/// Safetensors weights are kept as stored by default (bf16 in 16 bits with f32 math, f32 as f32),
/// widened to f32 at load with [`WeightMode::F32`], or rounded with Q8 / bf16.
pub fn load_decoder(path: &Path, mode: WeightMode) -> Result<Box<dyn Decoder>> {
    load_decoder_from(&TensorSource::open(path)?, mode)
}

/// [`load_decoder`] with the weights on `place.device`.
pub fn load_decoder_on(path: &Path, place: &Placement) -> Result<Box<dyn Decoder>> {
    load_decoder_from(&TensorSource::open(path)?, place)
}

/// [`load_decoder`] from an already opened source (whose GGUF header the caller may also read,
/// e.g. for the tokenizer).
pub fn load_decoder_from(
    source: &TensorSource,
    place: impl Into<Placement>,
) -> Result<Box<dyn Decoder>> {
    let place = place.into();
    let mode = place.mode;
    let config = source.decoder_config()?;
    // Safetensors weights are as stored (16-bit where exactly bf16) unless f32, Q8 or bf16 was
    // asked; GGUF files keep their own types.
    let mode = match (source, mode) {
        (TensorSource::Safetensors { .. }, WeightMode::Q8) => WeightMode::Q8,
        (TensorSource::Safetensors { .. }, WeightMode::Bf16) => WeightMode::Bf16,
        (TensorSource::Safetensors { .. }, WeightMode::Quantized) => WeightMode::Quantized,
        (TensorSource::Safetensors { .. }, _) => WeightMode::F32,
        (TensorSource::Gguf(_), WeightMode::F32) => WeightMode::F32,
        (TensorSource::Gguf(_), _) => WeightMode::Quantized,
    };
    let family = DECODER_FAMILIES
        .iter()
        .find(|f| f.arch == config.arch)
        .expect("every architecture has a registry row");
    let lora = place.lora.clone();
    let placed = Placement { mode, ..place };
    let decoder = (family.load)(config, source, &placed)?;
    if let Some(plan) = lora {
        plan.finish()?;
    }
    Ok(decoder)
}

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
    /// Last hidden state of every token: f32 [batch.n_tokens(), hidden_size]. The pass runs on
    /// a worker of the thread pool ([`crate::ops::pass`]), so its parallel kernels split work
    /// by stealing instead of sleeping until the workers finish.
    fn forward(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        crate::ops::pass(|| self.forward_on_pool(batch))
    }
    /// [`Encoder::forward`] on the calling thread; implementations provide this one.
    fn forward_on_pool(&self, batch: &PackedBatch) -> Result<Vec<f32>>;
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
    load_encoder_on(dir, &crate::backend::Device::Cpu)
}

/// [`load_encoder`] with the encoder's layers on `device` (BERT-family encoders; the others
/// run on the CPU only and are refused elsewhere, naming the device).
pub fn load_encoder_on(dir: &Path, device: &crate::backend::Device) -> Result<Box<dyn Encoder>> {
    load_encoder_with(dir, &Placement::new(WeightMode::F32, device.clone()))
}

/// [`load_encoder`] with the layers' matrices held and placed as `place` says:
/// [`WeightMode::F32`] (the exact default), [`WeightMode::Bf16`] (weights rounded to bf16,
/// products over bf16-rounded activations with f32 sums) or [`WeightMode::Q8`] (on the CPU
/// held as [`WeightMode::Int8`]: weights and activations quantized to int8 per row, exact
/// integer sums; on a GPU Q8_0 weights). [`WeightMode::Quantized`] keeps
/// exactly-bf16 checkpoints in 16 bits with f32 results. BERT-family encoders run on a GPU too;
/// the others on the CPU only, and are refused elsewhere, naming the device.
pub fn load_encoder_with(dir: &Path, place: &Placement) -> Result<Box<dyn Encoder>> {
    let device = &place.device;
    let place = &place.for_encoder();
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
            Ok(Box::new(bert::BertModel::load(&store, &cfg, place)?))
        }
        _ if !device.is_cpu() => Err(Error::Device(format!(
            "encoders of model_type `{model_type}` do not run on {device} yet (BERT-family \
             encoders do; use --device cpu)"
        ))),
        "mpnet" => {
            let (cfg, path) = read_config::<mpnet::MpnetConfig>(dir)?;
            cfg.validate(&path)?;
            let store = WeightStore::open_dir(dir)?;
            Ok(Box::new(mpnet::MpnetModel::load(&store, &cfg, place)?))
        }
        // Decoder-only embedding models (Qwen3-Embedding): the decoder without its head.
        "qwen3" | "qwen2" | "llama" | "mistral" => {
            let source = source::TensorSource::open(dir)?;
            let cfg = source.decoder_config()?;
            Ok(Box::new(llama::LlamaModel::load(cfg, &source, place, false)?))
        }
        other => Err(Error::UnsupportedModel(format!(
            "model_type `{other}` in {} (supported encoders: bert, roberta, xlm-roberta, mpnet, qwen3, qwen2, llama, mistral)",
            path.display()
        ))),
    }
}
