//! Where a decoder's weights come from: a transformers checkpoint (config.json + safetensors)
//! or a GGUF file. Model code asks for tensors by their transformers names
//! (`model.layers.3.self_attn.q_proj`); the GGUF side translates them to llama.cpp's names
//! (`blk.3.attn_q`) and undoes the row permutation llama.cpp's converter applies to Llama's
//! query and key projections, so one model file serves both. Value transforms the converter
//! applies to other architectures are undone here too, by methods that return one meaning
//! whatever the format: [`TensorSource::zero_centred_norm`] (Qwen3.5's `1 + w` norms),
//! [`TensorSource::a_log_exp`] (`exp(A_log)`; GGUF stores `−exp(A_log)`) and
//! [`TensorSource::conv_kernel`] (a depthwise kernel as [channels, kernel]).

use std::path::Path;

use crate::backend::cpu::bf16::bf16_to_f32;
use crate::backend::cpu::TernaryMatrix;
use crate::backend::{Device, Mirror};
use crate::io::gguf_tensors::{GgufTensors, RawTensor};
use crate::io::store::{Weight, WeightStore};
use crate::ops::{Linear, QuantMatrix};
use crate::quant::ternary::{self, TernaryScale};
use crate::quant::{quantize_row, QuantType};
use crate::tensor::Tensor;
use crate::{Error, Result};

use super::decoder::DecoderConfig;

/// How weights are held in memory once loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightMode {
    /// Everything f32 (GGUF blocks dequantized at load): the reference path.
    F32,
    /// Weights as stored: GGUF quantized blocks multiplied directly; safetensors matrices whose
    /// values are all bf16 (bf16 checkpoints) kept in 16 bits and widened to f32 inside the
    /// kernels on the CPU (the f32 results at half the bytes), other safetensors weights f32.
    Quantized,
    /// Matrices quantized to Q8_0 at load (safetensors f32 / f16 / bf16 weights; GGUF files
    /// keep their own block types).
    Q8,
    /// Matrices rounded to bf16 at load (exact for bf16 checkpoints) and multiplied with
    /// bf16-rounded activations, f32 sums: half the bytes of f32, twice the product rate on
    /// CPUs with AVX512-BF16. Safetensors only (GGUF files keep their own types).
    Bf16,
    /// Matrices quantized to int8 per output row at load, multiplying input rows quantized
    /// to int8 per row (exact integer sums): the encoders' `--q8` on the CPU (ONNX Runtime's
    /// dynamic quantization, per channel). Safetensors only.
    Int8,
}

impl WeightMode {
    /// Short name for logs (`"f32"`, `"as stored"`).
    pub fn name(self) -> &'static str {
        match self {
            WeightMode::F32 => "f32",
            WeightMode::Quantized => "as stored",
            WeightMode::Q8 => "q8_0",
            WeightMode::Bf16 => "bf16",
            WeightMode::Int8 => "int8",
        }
    }
}

/// How and where a model's matrices are held: the [`WeightMode`] and the [`Device`].
#[derive(Debug, Clone)]
pub struct Placement {
    /// How matrices are held.
    pub mode: WeightMode,
    /// Where weights, activations and KV pages live.
    pub device: Device,
    /// LoRA adapters applied to the projections (merged or beside them).
    pub lora: Option<std::sync::Arc<crate::lora::LoraPlan>>,
    /// Sees every projection's input rows (calibration; CPU only).
    pub probe: Option<std::sync::Arc<dyn crate::ops::InputProbe>>,
}

impl Placement {
    /// `mode` on `device`.
    pub fn new(mode: WeightMode, device: Device) -> Self {
        Self {
            mode,
            device,
            lora: None,
            probe: None,
        }
    }

    /// This placement for an encoder: `--q8` ([`WeightMode::Q8`]) on the CPU becomes
    /// [`WeightMode::Int8`] (int8 rows on both sides of each product, as ONNX Runtime
    /// quantizes encoders); anything else as it is.
    pub fn for_encoder(&self) -> Placement {
        let mut p = self.clone();
        if p.mode == WeightMode::Q8 && p.device.is_cpu() {
            p.mode = WeightMode::Int8;
        }
        p
    }

    /// Refuses quantized blocks on a device that cannot multiply with them.
    fn check_quant(&self, what: &str) -> Result<()> {
        if self.device.supports(crate::backend::Op::LinearQuant) {
            return Ok(());
        }
        Err(Error::Device(format!(
            "{what}: quantized matrices are not implemented on {} yet (dequantize them with \
             --f32, or use a safetensors checkpoint with --bf16)",
            self.device
        )))
    }
}

impl From<WeightMode> for Placement {
    /// `mode` on the CPU.
    fn from(mode: WeightMode) -> Self {
        Self::new(mode, Device::Cpu)
    }
}

impl From<&Placement> for Placement {
    fn from(p: &Placement) -> Self {
        p.clone()
    }
}

/// A layer over the f32 rows `w` [out_dim, in_dim] held as `place` says: quantized to Q8_0
/// ([`WeightMode::Q8`], when `in_dim` is whole Q8_0 blocks), to int8 per row
/// ([`WeightMode::Int8`], CPU only), rounded to bf16
/// ([`WeightMode::Bf16`]), kept in 16 bits when every value is exactly bf16
/// ([`WeightMode::Quantized`] on the CPU), else f32. `what` names the layer in errors.
pub(crate) fn dense_linear(
    place: &Placement,
    w: &[f32],
    out_dim: usize,
    in_dim: usize,
    bias: Option<Vec<f32>>,
    what: &str,
) -> Result<Linear> {
    let dev = &place.device;
    match QuantType::Q8_0.row_bytes(in_dim) {
        Some(row_bytes) if place.mode == WeightMode::Q8 => {
            place.check_quant(what)?;
            let mut bytes = vec![0u8; out_dim * row_bytes];
            for (src, dst) in w
                .chunks_exact(in_dim)
                .zip(bytes.chunks_exact_mut(row_bytes))
            {
                quantize_row(QuantType::Q8_0, src, dst)?;
            }
            let q = QuantMatrix::new(QuantType::Q8_0, out_dim, in_dim, &bytes)?;
            Linear::from_quant_on(dev, vec![q], bias)
        }
        _ if place.mode == WeightMode::Int8 => {
            if !dev.is_cpu() {
                return Err(Error::Device(format!(
                    "{what}: int8 matrices run on the CPU only (not on {dev})"
                )));
            }
            Linear::from_int8(w, out_dim, in_dim, bias, what)
        }
        _ if place.mode == WeightMode::Bf16 => Linear::from_bf16_on(dev, w, out_dim, in_dim, bias),
        _ if place.mode == WeightMode::Quantized && dev.is_cpu() => {
            Linear::from_f32_compact(w, out_dim, in_dim, bias)
        }
        // Widths that are not whole Q8_0 blocks stay f32.
        _ => Linear::from_f32_on(dev, w, out_dim, in_dim, bias),
    }
}

/// How a checkpoint holds its BitNet (ternary) layers: transformers' `quantization_config`
/// (`linear_class`, `quantization_mode`), or a GGUF file's tensor types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BitLinearKind {
    /// `bitlinear`: packed `uint8` values, `weight_scale = 1 / mean|W|` (divides).
    Packed,
    /// `autobitlinear`, offline: packed values, `weight_scale = mean|W|` (multiplies).
    PackedAuto,
    /// `autobitlinear`, online: full-precision master weights ternarized at load.
    Online,
    /// GGUF: TQ1_0 / TQ2_0 / I2_S blocks, or float tensors holding ternary values.
    Gguf,
}

/// An opened weights file or folder.
#[derive(Debug)]
pub enum TensorSource {
    /// A transformers checkpoint folder.
    Safetensors {
        /// The tensors.
        store: WeightStore,
        /// What the checkpoint puts where transformers' causal-LM names say `model.`: `model.`
        /// itself, nothing (a bare base model such as Qwen3-Embedding), or
        /// `model.language_model.` (multimodal checkpoints such as Qwen3.5).
        model_prefix: String,
        /// The parsed `config.json`.
        config: serde_json::Value,
        /// Its path.
        config_path: std::path::PathBuf,
    },
    /// A GGUF file.
    Gguf(GgufTensors),
}

/// An embedding table, also usable as a tied output head.
#[derive(Debug)]
pub enum EmbeddingTable {
    /// f32 rows (and their copy on a GPU, made on first use there).
    F32(Weight, Mirror),
    /// Quantized rows, dequantized on lookup (on a GPU: the whole table, on first use there).
    Quant(QuantMatrix, Mirror),
    /// Rows of a bf16 checkpoint kept in 16 bits ([rows × dim] bf16 bits), widened on lookup
    /// (exact: half the memory of [`EmbeddingTable::F32`] for the same values).
    Bf16 {
        /// The bf16 bits, row after row.
        bits: Vec<u16>,
        /// Width of a row.
        dim: usize,
        /// The widened table on a GPU, made on first use there.
        mirror: Mirror,
    },
}

impl EmbeddingTable {
    /// Rows of the table.
    pub fn n_rows(&self) -> usize {
        match self {
            EmbeddingTable::F32(w, _) => w.shape()[0],
            EmbeddingTable::Quant(q, _) => q.n_rows(),
            EmbeddingTable::Bf16 { bits, dim, .. } => bits.len() / (*dim).max(1),
        }
    }

    /// The whole table widened to f32 [rows × dim] (a copy for the f32 and bf16 forms).
    fn to_f32(&self) -> Vec<f32> {
        match self {
            EmbeddingTable::F32(w, _) => w.as_slice().to_vec(),
            EmbeddingTable::Quant(q, _) => q.dequantize(),
            EmbeddingTable::Bf16 { bits, .. } => bits.iter().map(|&b| bf16_to_f32(b)).collect(),
        }
    }

    /// Writes row `id` into `out` (the table's width); fails for ids outside the table.
    pub fn lookup(&self, id: u32, out: &mut [f32]) -> Result<()> {
        let id = id as usize;
        if id >= self.n_rows() {
            return Err(Error::InvalidInput(format!(
                "token id {id} is outside the vocabulary of {} tokens",
                self.n_rows()
            )));
        }
        match self {
            EmbeddingTable::F32(w, _) => {
                let d = out.len();
                out.copy_from_slice(&w.as_slice()[id * d..(id + 1) * d]);
            }
            EmbeddingTable::Quant(q, _) => q.dequantize_row_into(id, out),
            EmbeddingTable::Bf16 { bits, .. } => {
                let d = out.len();
                for (o, &b) in out.iter_mut().zip(&bits[id * d..(id + 1) * d]) {
                    *o = bf16_to_f32(b);
                }
            }
        }
        Ok(())
    }

    /// Rows `ids` as a tensor [ids.len(), dim] on `device` (looked up there when the table
    /// is f32 and the device has a copy of it).
    pub fn lookup_tensor(&self, ids: &[u32], device: &Device) -> Result<Tensor> {
        let (rows, dim) = (self.n_rows(), self.dim());
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= rows) {
            return Err(Error::InvalidInput(format!(
                "token id {bad} is outside the vocabulary of {rows} tokens"
            )));
        }
        match (self, device) {
            #[cfg(feature = "cuda")]
            (EmbeddingTable::F32(w, m), Device::Cuda(d)) => {
                let table = m.cuda(d, w.as_slice())?;
                let y = d.embed_f32(table, rows, ids, dim)?;
                Ok(Tensor::cuda(d, ids.len(), dim, y))
            }
            #[cfg(feature = "cuda")]
            (
                EmbeddingTable::Quant(_, m) | EmbeddingTable::Bf16 { mirror: m, .. },
                Device::Cuda(d),
            ) => {
                let table = m.cuda_with(d, || self.to_f32())?;
                let y = d.embed_f32(table, rows, ids, dim)?;
                Ok(Tensor::cuda(d, ids.len(), dim, y))
            }
            _ => {
                let mut x = vec![0.0f32; ids.len() * dim];
                for (&id, row) in ids.iter().zip(x.chunks_exact_mut(dim.max(1))) {
                    self.lookup(id, row)?;
                }
                Tensor::from_host(device, ids.len(), dim, x)
            }
        }
    }

    /// Width of a row.
    pub fn dim(&self) -> usize {
        match self {
            EmbeddingTable::F32(w, _) => w.shape()[1],
            EmbeddingTable::Quant(q, _) => q.k(),
            EmbeddingTable::Bf16 { dim, .. } => *dim,
        }
    }

    /// The table as an output head (`logits = h · Eᵀ`); f32 tables held as [`dense_linear`]
    /// holds a layer's matrix (Q8_0 for [`WeightMode::Q8`], bf16 for [`WeightMode::Bf16`], …).
    pub fn to_linear(&self, place: impl Into<Placement>) -> Result<Linear> {
        let place = place.into();
        let (mode, dev) = (place.mode, &place.device);
        if mode == WeightMode::Q8 || matches!(self, EmbeddingTable::Quant(..)) {
            place.check_quant("the output head")?;
        }
        match self {
            EmbeddingTable::F32(w, _) => {
                let (rows, cols) = (w.shape()[0], w.shape()[1]);
                dense_linear(&place, w.as_slice(), rows, cols, None, "the output head")
            }
            EmbeddingTable::Quant(q, _) => Linear::from_quant_on(dev, vec![q.clone()], None),
            EmbeddingTable::Bf16 { bits, dim, .. }
                if mode == WeightMode::Quantized && dev.is_cpu() =>
            {
                Linear::from_bf16_bits(bits, self.n_rows(), *dim, None)
            }
            EmbeddingTable::Bf16 { dim, .. } => {
                let w = self.to_f32();
                dense_linear(&place, &w, self.n_rows(), *dim, None, "the output head")
            }
        }
    }
}

/// The safetensors matrices `prefixes` (each `[out_dims[i], in_dim]`) stacked in f32, with the
/// LoRA deltas of `lora` merged in.
fn stacked_f32(
    store: &WeightStore,
    model_prefix: &str,
    prefixes: &[&str],
    out_dims: &[usize],
    in_dim: usize,
    lora: &[(usize, usize, Vec<crate::lora::LowRank>)],
) -> Result<Vec<f32>> {
    let mut rows: Vec<f32> = Vec::with_capacity(out_dims.iter().sum::<usize>() * in_dim);
    for (p, &n) in prefixes.iter().zip(out_dims) {
        let name = TensorSource::st_name(model_prefix, p, "weight");
        rows.extend_from_slice(store.get(&name, &[n, in_dim])?.as_slice());
    }
    merge_lora(&mut rows, in_dim, lora);
    Ok(rows)
}

/// Adds each part's LoRA deltas into its rows of `w` [out_dim, in_dim].
fn merge_lora(w: &mut [f32], in_dim: usize, parts: &[(usize, usize, Vec<crate::lora::LowRank>)]) {
    for (col, n, f) in parts {
        crate::lora::merge_into(&mut w[col * in_dim..(col + n) * in_dim], in_dim, f);
    }
}

/// Translates transformers tensor `prefix.suffix` to llama.cpp's GGUF name in a file of
/// architecture `arch`. Qwen3.5's per-head GDN parameters (`linear_attn.A_log`, `.dt_bias`) are
/// tensors of their own there (`ssm_a`, holding `−exp(A_log)`: see [`TensorSource::a_log_exp`],
/// and `ssm_dt.bias`).
fn gguf_tensor_name(prefix: &str, suffix: &str, arch: &str) -> Option<String> {
    if matches!(suffix, "A_log" | "dt_bias") {
        return gguf_name(&format!("{prefix}.{suffix}"), arch);
    }
    gguf_name(prefix, arch).map(|n| format!("{n}.{suffix}"))
}

/// Translates a transformers tensor prefix to llama.cpp's GGUF name.
fn gguf_name(hf: &str, arch: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens" => Some("token_embd"),
        "model.norm" => Some("output_norm"),
        "lm_head" => Some("output"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let part = match part {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if arch == "qwen35" => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "self_attn.attn_sub_norm" => "attn_sub_norm",
        "mlp.ffn_sub_norm" => "ffn_sub_norm",
        "linear_attn.in_proj_qkv" => "attn_qkv",
        "linear_attn.in_proj_z" => "attn_gate",
        "linear_attn.in_proj_b" => "ssm_beta",
        "linear_attn.in_proj_a" => "ssm_alpha",
        "linear_attn.conv1d" => "ssm_conv1d",
        "linear_attn.A_log" => "ssm_a",
        "linear_attn.dt_bias" => "ssm_dt.bias",
        "linear_attn.norm" => "ssm_norm",
        "linear_attn.out_proj" => "ssm_out",
        _ => return None,
    };
    Some(format!("blk.{layer}.{part}"))
}

impl TensorSource {
    /// Opens a model folder (config.json + safetensors) or a `.gguf` file.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let store = WeightStore::open_dir(path)?;
            let config_path = path.join("config.json");
            let text =
                std::fs::read_to_string(&config_path).map_err(|e| Error::io(&config_path, e))?;
            let config = serde_json::from_str(&text).map_err(|e| Error::InvalidConfig {
                path: config_path.clone(),
                reason: e.to_string(),
            })?;
            let model_prefix = ["model.", "model.language_model.", ""]
                .into_iter()
                .find(|p| store.contains(&format!("{p}embed_tokens.weight")))
                .unwrap_or("model.")
                .to_string();
            Ok(Self::Safetensors {
                store,
                model_prefix,
                config,
                config_path,
            })
        } else if path.is_file() {
            Ok(Self::Gguf(GgufTensors::open(path)?))
        } else {
            Err(Error::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such model folder or .gguf file",
                ),
            ))
        }
    }

    /// The decoder configuration, with GGUF's implicit choices (tied head, biases) resolved from
    /// the tensors present.
    pub fn decoder_config(&self) -> Result<DecoderConfig> {
        match self {
            Self::Safetensors {
                config,
                config_path,
                ..
            } => DecoderConfig::from_hf_json(config, config_path),
            Self::Gguf(g) => {
                let mut c = DecoderConfig::from_gguf(g.header())?;
                c.tie_word_embeddings = !g.contains("output.weight");
                c.qkv_bias = g.contains("blk.0.attn_q.bias");
                c.o_bias = g.contains("blk.0.attn_output.bias");
                c.mlp_bias = g.contains("blk.0.ffn_up.bias");
                if g.contains("rope_freqs.weight") {
                    return Err(Error::UnsupportedModel(format!(
                        "{}: per-frequency RoPE factors (rope_freqs.weight) are not supported yet",
                        g.header().path().display()
                    )));
                }
                Ok(c)
            }
        }
    }

    /// The checkpoint's name for `prefix.suffix` (transformers causal-LM naming).
    fn st_name(model_prefix: &str, prefix: &str, suffix: &str) -> String {
        match prefix.strip_prefix("model.") {
            Some(rest) => format!("{model_prefix}{rest}.{suffix}"),
            None => format!("{prefix}.{suffix}"),
        }
    }

    /// The file's own name of the tensors under `prefix` (transformers naming): the GGUF
    /// name (`blk.3.attn_q`) or the checkpoint's.
    pub fn tensor_prefix(&self, prefix: &str) -> String {
        match self {
            Self::Safetensors { model_prefix, .. } => {
                let full = Self::st_name(model_prefix, prefix, "");
                full.trim_end_matches('.').to_string()
            }
            Self::Gguf(g) => gguf_name(prefix, gguf_arch(g)).unwrap_or_else(|| prefix.to_string()),
        }
    }

    /// The parsed `config.json` (safetensors folders only).
    pub fn hf_config(&self) -> Option<&serde_json::Value> {
        match self {
            Self::Safetensors { config, .. } => Some(config),
            Self::Gguf(_) => None,
        }
    }

    /// Whether tensor `prefix.suffix` exists (transformers naming).
    pub fn contains(&self, prefix: &str, suffix: &str) -> bool {
        match self {
            Self::Safetensors {
                store,
                model_prefix,
                ..
            } => store.contains(&Self::st_name(model_prefix, prefix, suffix)),
            Self::Gguf(g) => {
                gguf_tensor_name(prefix, suffix, gguf_arch(g)).is_some_and(|n| g.contains(&n))
            }
        }
    }

    fn gguf_full(g: &GgufTensors, prefix: &str, suffix: &str) -> Result<String> {
        gguf_tensor_name(prefix, suffix, gguf_arch(g)).ok_or_else(|| Error::MissingTensor {
            name: format!("{prefix}.{suffix}"),
            location: g.header().path().display().to_string(),
        })
    }

    /// Tensor `prefix.suffix` as f32 with `shape`.
    pub fn f32(&self, prefix: &str, suffix: &str, shape: &[usize]) -> Result<Weight> {
        match self {
            Self::Safetensors {
                store,
                model_prefix,
                ..
            } => store.get(&Self::st_name(model_prefix, prefix, suffix), shape),
            Self::Gguf(g) => g.f32(&Self::gguf_full(g, prefix, suffix)?, shape),
        }
    }

    /// The scale `1 + w` f32 [dim] of the zero-centred RMSNorm `prefix` (`y = (1 + w) ⊙
    /// norm(x)`, Qwen3.5's): transformers checkpoints store `w`, llama.cpp's converter `1 + w`.
    pub fn zero_centred_norm(&self, prefix: &str, dim: usize) -> Result<Weight> {
        let w = self.f32(prefix, "weight", &[dim])?;
        match self {
            Self::Gguf(_) => Ok(w),
            Self::Safetensors { .. } => {
                let shifted = w.as_slice().iter().map(|x| 1.0 + x).collect();
                Ok(Weight::from_vec(shifted, vec![dim]))
            }
        }
    }

    /// `exp(A_log)` f32 [n_heads] of the Gated DeltaNet layer `prefix` (its per-head decay
    /// rate): transformers checkpoints store `A_log`, llama.cpp's converter `ssm_a = −exp(A_log)`.
    pub fn a_log_exp(&self, prefix: &str, n_heads: usize) -> Result<Vec<f32>> {
        let a = self.f32(prefix, "A_log", &[n_heads])?;
        let a = a.as_slice().iter();
        Ok(match self {
            Self::Gguf(_) => a.map(|&x| -x).collect(),
            Self::Safetensors { .. } => a.map(|&x| x.exp()).collect(),
        })
    }

    /// The depthwise convolution kernel `prefix.weight` as f32 [channels, kernel]: transformers
    /// stores `Conv1d(groups = channels)`'s [channels, 1, kernel], GGUF [channels, kernel].
    pub fn conv_kernel(&self, prefix: &str, channels: usize, kernel: usize) -> Result<Vec<f32>> {
        let shape = match self {
            Self::Gguf(_) => vec![channels, kernel],
            Self::Safetensors { .. } => vec![channels, 1, kernel],
        };
        Ok(self.f32(prefix, "weight", &shape)?.as_slice().to_vec())
    }

    /// The embedding table `prefix.weight` [rows, dim].
    pub fn embedding(
        &self,
        prefix: &str,
        rows: usize,
        dim: usize,
        mode: WeightMode,
    ) -> Result<EmbeddingTable> {
        match self {
            Self::Gguf(g) if mode != WeightMode::F32 => {
                let t = g.raw_with_shape(&Self::gguf_full(g, prefix, "weight")?, &[rows, dim])?;
                Ok(EmbeddingTable::Quant(
                    QuantMatrix::new(t.qtype, rows, dim, t.bytes)?,
                    Mirror::new(),
                ))
            }
            Self::Safetensors {
                store,
                model_prefix,
                ..
            } if mode != WeightMode::F32 => {
                // A bf16 checkpoint's table stays in 16 bits unless f32 was asked for.
                let name = Self::st_name(model_prefix, prefix, "weight");
                Ok(match store.get_bf16(&name, &[rows, dim])? {
                    Some(bits) => EmbeddingTable::Bf16 {
                        bits: bits.into_owned(),
                        dim,
                        mirror: Mirror::new(),
                    },
                    None => EmbeddingTable::F32(store.get(&name, &[rows, dim])?, Mirror::new()),
                })
            }
            _ => Ok(EmbeddingTable::F32(
                self.f32(prefix, "weight", &[rows, dim])?,
                Mirror::new(),
            )),
        }
    }

    /// A linear layer stacking the projections `prefixes` (each `[out_dims[i], in_dim]`, with
    /// `.bias` when `bias`) along the output dimension.
    ///
    /// `rope_heads[i]`, when set, is the head count of a Llama query/key projection stored in
    /// llama.cpp's interleaved row order; its rows are put back in transformers' order.
    pub fn linear(
        &self,
        prefixes: &[&str],
        out_dims: &[usize],
        in_dim: usize,
        bias: bool,
        place: impl Into<Placement>,
        rope_heads: &[Option<usize>],
    ) -> Result<Linear> {
        let place = place.into();
        let (mode, dev) = (place.mode, &place.device);
        let mut bias_values = bias.then(Vec::new);
        if let Some(b) = bias_values.as_mut() {
            for ((p, &n), heads) in prefixes
                .iter()
                .zip(out_dims)
                .zip(rope_heads.iter().chain(std::iter::repeat(&None)))
            {
                let w = self.f32(p, "bias", &[n])?;
                match heads {
                    Some(h) if self.is_permuted_llama() => {
                        b.extend(unpermute_rows(w.as_slice(), *h, n / h, 1))
                    }
                    _ => b.extend_from_slice(w.as_slice()),
                }
            }
        }
        let out_dim: usize = out_dims.iter().sum();
        let lora = self.lora_factors(prefixes, out_dims, in_dim, &place)?;
        let merge = !lora.is_empty();
        let linear = match self {
            Self::Gguf(g) => {
                // Consecutive parts of one block type are concatenated into one matrix (rows
                // of GGUF blocks are independent), so their input is quantized once and the
                // product is one threaded pass.
                let mut groups: Vec<(crate::quant::QuantType, usize, Vec<u8>)> = Vec::new();
                for (i, (p, &n)) in prefixes.iter().zip(out_dims).enumerate() {
                    let name = Self::gguf_full(g, p, "weight")?;
                    let t: RawTensor<'_> = g.raw_with_shape(&name, &[n, in_dim])?;
                    let heads = rope_heads.get(i).copied().flatten();
                    let row_bytes = t.bytes.len() / n.max(1);
                    let bytes = match heads {
                        Some(h) if self.is_permuted_llama() => {
                            unpermute_rows(t.bytes, h, n / h, row_bytes)
                        }
                        _ => t.bytes.to_vec(),
                    };
                    match groups.last_mut() {
                        Some((qt, rows, data)) if *qt == t.qtype => {
                            *rows += n;
                            data.extend_from_slice(&bytes);
                        }
                        _ => groups.push((t.qtype, n, bytes)),
                    }
                }
                let parts = groups
                    .into_iter()
                    .map(|(qt, rows, data)| QuantMatrix::new(qt, rows, in_dim, &data))
                    .collect::<Result<Vec<_>>>()?;
                match mode {
                    WeightMode::Quantized
                    | WeightMode::Q8
                    | WeightMode::Bf16
                    | WeightMode::Int8 => {
                        if merge {
                            return Err(Error::InvalidInput(format!(
                                "{}: a LoRA adapter merges into f32 weights only; load the GGUF \
                                 with --f32, or apply it unmerged",
                                prefixes[0]
                            )));
                        }
                        place.check_quant(prefixes[0])?;
                        Linear::from_quant_on(dev, parts, bias_values)
                    }
                    WeightMode::F32 => {
                        let mut rows: Vec<f32> =
                            parts.iter().flat_map(QuantMatrix::dequantize).collect();
                        if merge {
                            merge_lora(&mut rows, in_dim, &lora);
                        }
                        Linear::from_f32_on(dev, &rows, out_dim, in_dim, bias_values)
                    }
                }
            }
            Self::Safetensors {
                store,
                model_prefix,
                ..
            } if place.mode == WeightMode::Quantized && dev.is_cpu() && !merge => {
                // The default on a CPU: a bf16 checkpoint's matrices are packed straight from
                // their stored bits (no f32 copy of each; a single part not copied at all);
                // other types as below.
                let parts = prefixes
                    .iter()
                    .zip(out_dims)
                    .map(|(p, &n)| {
                        store.get_bf16(&Self::st_name(model_prefix, p, "weight"), &[n, in_dim])
                    })
                    .collect::<Result<Vec<_>>>()?
                    .into_iter()
                    .collect::<Option<Vec<_>>>();
                match parts {
                    Some(parts) => {
                        let bits = match parts.as_slice() {
                            [one] => std::borrow::Cow::Borrowed(&one[..]),
                            _ => std::borrow::Cow::Owned(parts.concat()),
                        };
                        Linear::from_bf16_bits(&bits, out_dim, in_dim, bias_values)
                    }
                    None => {
                        let rows =
                            stacked_f32(store, model_prefix, prefixes, out_dims, in_dim, &lora)?;
                        dense_linear(&place, &rows, out_dim, in_dim, bias_values, prefixes[0])
                    }
                }
            }
            Self::Safetensors {
                store,
                model_prefix,
                ..
            } => {
                let rows = stacked_f32(store, model_prefix, prefixes, out_dims, in_dim, &lora)?;
                dense_linear(&place, &rows, out_dim, in_dim, bias_values, prefixes[0])
            }
        }?;
        // QuaRot files rotated the down projection's input offline (`crate::quantize`).
        let linear = match self.quarot_ffn_rotation(prefixes, in_dim)? {
            Some(r) => linear.with_input_rotation(r)?,
            None => linear,
        };
        let linear = match &place.probe {
            Some(probe) => {
                let names = prefixes.iter().map(|p| self.tensor_prefix(p)).collect();
                let site = probe.add_site(names, in_dim);
                linear.with_probe(std::sync::Arc::clone(probe), site)?
            }
            None => linear,
        };
        let Some(plan) = place.lora.as_ref().filter(|p| !p.merges()) else {
            return Ok(linear);
        };
        let per_row = !prefixes.contains(&"lm_head");
        let site = plan.add_site(self.lora_parts(prefixes, out_dims), in_dim, per_row)?;
        Ok(linear.with_lora(std::sync::Arc::clone(plan), site))
    }

    /// A BitNet layer stacking the ternary projections `prefixes` (each `[out_dims[i], in_dim]`)
    /// along the output dimension, read as `held` says (see [`BitLinearKind`]).
    pub fn ternary_linear(
        &self,
        prefixes: &[&str],
        out_dims: &[usize],
        in_dim: usize,
        held: BitLinearKind,
    ) -> Result<Linear> {
        let mut parts = Vec::with_capacity(prefixes.len());
        for (p, &n) in prefixes.iter().zip(out_dims) {
            let (values, scale) = self.ternary_part(p, n, in_dim, held)?;
            let m = TernaryMatrix::from_values(n, in_dim, &values)?;
            parts.push((m, scale));
        }
        Linear::from_ternary(parts, None)
    }

    fn ternary_part(
        &self,
        prefix: &str,
        n: usize,
        in_dim: usize,
        held: BitLinearKind,
    ) -> Result<(Vec<i8>, TernaryScale)> {
        match self {
            Self::Safetensors {
                store,
                model_prefix,
                config_path,
                ..
            } => {
                let name = Self::st_name(model_prefix, prefix, "weight");
                let bad = |reason: String| Error::InvalidWeights {
                    path: config_path.parent().unwrap_or(config_path).to_path_buf(),
                    reason: format!("tensor `{name}`: {reason}"),
                };
                if held == BitLinearKind::Online {
                    let w = store.get(&name, &[n, in_dim])?;
                    let (values, m) = ternary::ternarize_absmean(w.as_slice());
                    return Ok((values, TernaryScale::Multiply(m)));
                }
                let packed = store.get_u8(&name, &[n.div_ceil(4), in_dim])?;
                let values = ternary::unpack_hf(packed, n, in_dim).map_err(bad)?;
                let scale_name = Self::st_name(model_prefix, prefix, "weight_scale");
                let s = store.get(&scale_name, &[1])?.as_slice()[0];
                Ok((
                    values,
                    match held {
                        BitLinearKind::Packed => TernaryScale::Divide(s),
                        _ => TernaryScale::Multiply(s),
                    },
                ))
            }
            Self::Gguf(g) => {
                let name = Self::gguf_full(g, prefix, "weight")?;
                let (info, shape, bytes) = g.raw_untyped(&name)?;
                let path = g.header().path().to_path_buf();
                if shape != [n, in_dim] {
                    return Err(Error::ShapeMismatch {
                        name,
                        path,
                        expected: vec![n, in_dim],
                        found: shape,
                    });
                }
                let bad = |reason: String| Error::InvalidWeights {
                    path: path.clone(),
                    reason: format!("tensor `{name}`: {reason}"),
                };
                let (values, mut s) = if matches!(
                    info.ggml_type,
                    ternary::GGML_TQ1_0 | ternary::GGML_TQ2_0 | ternary::GGML_I2_S
                ) {
                    ternary::decode_ggml(info.ggml_type, bytes, n * in_dim).map_err(bad)?
                } else {
                    // Float (or other quantized) tensors holding ternary values, as llama.cpp's
                    // converter writes them with --outtype f32 / f16.
                    let w = g.f32(&name, &[n, in_dim])?;
                    ternary::ternary_values(w.as_slice()).ok_or_else(|| {
                        bad("a BitNet weight must hold 0 and ±s only (one s per tensor)".into())
                    })?
                };
                // llama.cpp's optional per-tensor scale (`blk.N.attn_q.scale`) multiplies too.
                let scale_name = Self::gguf_full(g, prefix, "scale")?;
                if g.contains(&scale_name) {
                    s *= g.f32(&scale_name, &[1])?.as_slice()[0];
                }
                Ok((values, TernaryScale::Multiply(s)))
            }
        }
    }

    /// The online rotation a QuaRot GGUF asks for before `mlp.down_proj`
    /// (`lattice.quantize.ffn_down_rotation_seed`), of order `in_dim`.
    fn quarot_ffn_rotation(
        &self,
        prefixes: &[&str],
        in_dim: usize,
    ) -> Result<Option<std::sync::Arc<crate::quant::hadamard::Rotation>>> {
        let Self::Gguf(g) = self else {
            return Ok(None);
        };
        let Some(seed) = g
            .header()
            .metadata(crate::quantize::FFN_ROTATION_KEY)
            .and_then(|v| v.as_u64())
        else {
            return Ok(None);
        };
        if !matches!(prefixes, [p] if p.ends_with(".mlp.down_proj")) {
            return Ok(None);
        }
        let r = crate::quant::hadamard::Rotation::new(in_dim, seed).ok_or_else(|| {
            Error::InvalidWeights {
                path: g.header().path().to_path_buf(),
                reason: format!("no rotation of order {in_dim} for the down projection"),
            }
        })?;
        Ok(Some(std::sync::Arc::new(r)))
    }

    /// `(first output column, outputs, module names)` of each projection `prefixes` stacks in
    /// one layer: transformers' name, then the checkpoint's own if it differs (e.g. Qwen3.5's
    /// `model.language_model.`), as adapters name them.
    fn lora_parts(
        &self,
        prefixes: &[&str],
        out_dims: &[usize],
    ) -> Vec<(usize, usize, Vec<String>)> {
        let mut parts = Vec::with_capacity(prefixes.len());
        let mut col = 0;
        for (p, &n) in prefixes.iter().zip(out_dims) {
            let mut names = vec![p.to_string()];
            if let Self::Safetensors { model_prefix, .. } = self {
                let full = Self::st_name(model_prefix, p, "");
                let full = full.trim_end_matches('.');
                if full != *p {
                    names.push(full.to_owned());
                }
            }
            parts.push((col, n, names));
            col += n;
        }
        parts
    }

    /// The factors of a merged plan's adapters for the projections `prefixes` stacked in one
    /// layer: `(first output column, outputs, factors)` of each part some adapter targets.
    fn lora_factors(
        &self,
        prefixes: &[&str],
        out_dims: &[usize],
        in_dim: usize,
        place: &Placement,
    ) -> Result<Vec<(usize, usize, Vec<crate::lora::LowRank>)>> {
        let Some(plan) = place.lora.as_ref().filter(|p| p.merges()) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for (col, n, names) in self.lora_parts(prefixes, out_dims) {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let f = plan.factors(&names, in_dim, n)?;
            if !f.is_empty() {
                out.push((col, n, f));
            }
        }
        Ok(out)
    }

    /// Whether this is a GGUF Llama file, whose Q/K rows llama.cpp's converter interleaved.
    fn is_permuted_llama(&self) -> bool {
        match self {
            Self::Gguf(g) => {
                g.header()
                    .metadata("general.architecture")
                    .and_then(|v| v.as_str())
                    == Some("llama")
            }
            Self::Safetensors { .. } => false,
        }
    }
}

/// A GGUF file's `general.architecture` (empty when absent).
fn gguf_arch(g: &GgufTensors) -> &str {
    g.header()
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("")
}

/// Undoes llama.cpp's Q/K permutation: within each head of `head_dim` rows, GGUF row
/// `2j + t` holds transformers row `t · head_dim/2 + j`. Rows are `row_len` elements long.
fn unpermute_rows<T: Copy + Default>(
    data: &[T],
    n_heads: usize,
    head_dim: usize,
    row_len: usize,
) -> Vec<T> {
    let half = head_dim / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_heads {
        for t in 0..2 {
            for j in 0..half {
                let dst = (h * head_dim + t * half + j) * row_len;
                let src = (h * head_dim + 2 * j + t) * row_len;
                out[dst..dst + row_len].copy_from_slice(&data[src..src + row_len]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gguf_names() {
        assert_eq!(
            gguf_name("model.layers.12.self_attn.k_proj", "llama").unwrap(),
            "blk.12.attn_k"
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.down_proj", "qwen2").unwrap(),
            "blk.0.ffn_down"
        );
        assert_eq!(gguf_name("lm_head", "llama").unwrap(), "output");
        assert!(gguf_name("model.layers.0.unknown", "llama").is_none());
        let qwen35 = |p: &str, s: &str| gguf_tensor_name(p, s, "qwen35").unwrap();
        assert_eq!(
            qwen35("model.layers.1.post_attention_layernorm", "weight"),
            "blk.1.post_attention_norm.weight"
        );
        assert_eq!(qwen35("model.layers.2.linear_attn", "A_log"), "blk.2.ssm_a");
        assert_eq!(
            qwen35("model.layers.2.linear_attn", "dt_bias"),
            "blk.2.ssm_dt.bias"
        );
        assert_eq!(
            qwen35("model.layers.0.linear_attn.in_proj_z", "weight"),
            "blk.0.attn_gate.weight"
        );
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: reshape(n_head, 2, hd/2, ...).swapaxes(1, 2): GGUF row h·hd + 2j + t
        // comes from transformers row h·hd + t·hd/2 + j.
        let (heads, hd) = (2, 6);
        let hf: Vec<u8> = (0..(heads * hd) as u8).collect();
        let mut gguf = vec![0u8; hf.len()];
        for h in 0..heads {
            for j in 0..hd / 2 {
                for t in 0..2 {
                    gguf[h * hd + 2 * j + t] = hf[h * hd + t * hd / 2 + j];
                }
            }
        }
        assert_eq!(unpermute_rows(&gguf, heads, hd, 1), hf);
    }
}
