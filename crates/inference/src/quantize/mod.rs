//! Re-quantizing a GGUF decoder (`lattice quantize`): plain block types (the baselines) and
//! QuaRot (arXiv 2404.00456) with 4-bit weights and int8 activations.
//!
//! QuaRot, done offline into the weights (so the output is an ordinary GGUF of the same
//! architecture, which llama.cpp runs too):
//! 1. every RMSNorm scale γ is folded into the matrices that read the normalized stream
//!    (`W ← W · diag(γ)` for Q/K/V, gate/up and the output head; the norms become 1), so the
//!    norms commute with rotations;
//! 2. the residual stream is rotated by a randomized Hadamard matrix `Q` (`quant::hadamard`):
//!    the embedding rows and every matrix reading the stream become `W · Q`, every matrix
//!    writing it (attention output, down projection, their biases) `Qᵀ · W`; the head is untied
//!    (`output.weight` = the folded, rotated embedding). In exact arithmetic the model computes
//!    the same function; the rotated matrices have no outlier columns, so 4-bit groups fit;
//! 3. the layer matrices are quantized to Q4_0 or Q4_1 (groups of 32, f16 scales; Q4_1 with a
//!    minimum, i.e. asymmetric), the embedding and head to Q8_0. At run time the activations
//!    are quantized to int8 per 32 values (Q8_0 / Q8_1) by the existing integer kernels.
//!
//! Rounding of the 4-bit groups ([`Rounding`]): to the nearest code (ggml's reference), with
//! each group's parameters searched for the least squared error (`search`), or GPTQ (`gptq`):
//! the f32 model as rewritten (rotated for QuaRot) runs a calibration text with a probe on
//! every projection's input, and each layer matrix is rounded column by column against its
//! input Hessian. The embedding and the head (which calibration runs for one row per chunk)
//! keep the searched rounding. Every layer's Hessian is held (f64) while calibrating, ~5 GB for a
//! 0.5B model; a run whose Hessians exceed the available memory is refused before it starts.
//!
//! QuaRot's online Hadamard transforms (before the down projection and on the values) matter
//! for 4-bit activations; with 8-bit activations they are left out, so no run-time change is
//! needed. `rotate-f32` keeps every matrix f32 after the rotation: the check that steps 1-2
//! preserve the model (tests compare its logits with the original's).

mod gptq;
mod search;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use gptq::{Hessian, Hessians};

use crate::backend::Device;
use crate::engine::TextModel;
use crate::io::gguf::GgufValue;
use crate::io::gguf_tensors::{dequantize, GgufTensors};
use crate::io::gguf_write::{write_gguf, TensorOut};
use crate::model::source::{Placement, WeightMode};
use crate::quant::hadamard::Rotation;
use crate::quant::{quantize_row, QuantType};
use crate::{Error, Result};

/// How 4-bit groups are rounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// ggml's reference quantizers (the scale from the group's extreme values).
    Nearest,
    /// The scale (Q4_0) or range (Q4_1) of each group searched over a grid of clipped values
    /// for the least squared error, the stored f16 scale included.
    Mse,
    /// GPTQ over the input Hessians of a [`Calibration`] run (groups' parameters searched as
    /// `Mse` when the sweep reaches them).
    Gptq,
}

/// The text GPTQ's Hessians are collected over.
#[derive(Debug, Clone, Copy)]
pub struct Calibration<'a> {
    /// UTF-8 text; its first `tokens` tokens (whole chunks) are run.
    pub text: &'a str,
    /// Tokens to run (rounded down to whole chunks, at least one).
    pub tokens: usize,
    /// Tokens per chunk, each run from an empty cache.
    pub ctx: usize,
}

/// A stage of [`quantize_gguf`], for progress reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Tensors read and rewritten in f32.
    Rewrite,
    /// Calibration chunks run (GPTQ).
    Calibrate,
    /// Tensors rounded and encoded.
    Encode,
}

impl Stage {
    /// Short name for progress lines.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Rewrite => "rewrite",
            Stage::Calibrate => "calibrate",
            Stage::Encode => "encode",
        }
    }
}

/// GGUF metadata key of a QuaRot file whose down projections take rotated inputs: the seed of
/// the rotation (order = the FFN width) the loader applies to their input rows.
pub const FFN_ROTATION_KEY: &str = "lattice.quantize.ffn_down_rotation_seed";

/// What `lattice quantize` makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Every matrix (2-D tensor) to this block type; the rest F32. No rotation.
    Plain(QuantType),
    /// QuaRot: norms folded, residual stream rotated; layer matrices to `weights` (Q4_0 or
    /// Q4_1, or F32 for the rotation alone), embedding and head to Q8_0 (F32 with F32).
    Quarot {
        /// Block type of the layer matrices.
        weights: QuantType,
        /// Seed of the rotation's random signs.
        seed: u64,
        /// Also rotate the down projections' inputs (an online Hadamard of the FFN width at
        /// run time, which only Lattice applies: such files are not for llama.cpp).
        online: bool,
    },
}

impl Method {
    /// Parses a `--method` value: `f32`, `f16`, `q8_0`, `q4_0`, `q4_1`, `quarot-w4a8` (Q4_1
    /// layers), `quarot-w4a8-sym` (Q4_0 layers), `rotate-f32` (the rotation alone); `-online`
    /// after a QuaRot name also rotates the down projections' inputs at run time.
    pub fn parse(name: &str, seed: u64) -> Option<Self> {
        let plain = |t| Some(Method::Plain(t));
        match name {
            "f32" => plain(QuantType::F32),
            "f16" => plain(QuantType::F16),
            "q8_0" => plain(QuantType::Q8_0),
            "q4_0" => plain(QuantType::Q4_0),
            "q4_1" => plain(QuantType::Q4_1),
            "quarot-w4a8" => Some(Method::Quarot {
                weights: QuantType::Q4_1,
                seed,
                online: false,
            }),
            "quarot-w4a8-sym" => Some(Method::Quarot {
                weights: QuantType::Q4_0,
                seed,
                online: false,
            }),
            "quarot-w4a8-online" => Some(Method::Quarot {
                weights: QuantType::Q4_1,
                seed,
                online: true,
            }),
            "quarot-w4a8-sym-online" => Some(Method::Quarot {
                weights: QuantType::Q4_0,
                seed,
                online: true,
            }),
            "rotate-f32" => Some(Method::Quarot {
                weights: QuantType::F32,
                seed,
                online: false,
            }),
            "rotate-f32-online" => Some(Method::Quarot {
                weights: QuantType::F32,
                seed,
                online: true,
            }),
            _ => None,
        }
    }

    /// The names [`Method::parse`] accepts.
    pub const NAMES: &'static [&'static str] = &[
        "f32",
        "f16",
        "q8_0",
        "q4_0",
        "q4_1",
        "quarot-w4a8",
        "quarot-w4a8-sym",
        "quarot-w4a8-online",
        "quarot-w4a8-sym-online",
        "rotate-f32",
        "rotate-f32-online",
    ];
}

/// What [`quantize_gguf`] wrote.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Tensor bytes read.
    pub bytes_before: u64,
    /// Tensor bytes written.
    pub bytes_after: u64,
    /// Tensors written.
    pub tensors: usize,
}

/// Architectures whose layers are the Llama structure QuaRot's folding assumes.
const ARCHS: &[&str] = &["llama", "qwen2", "qwen3"];

/// An f32 tensor being rewritten: name, GGML dims (innermost first), values.
struct Dense {
    name: String,
    dims: Vec<u64>,
    values: Vec<f32>,
}

/// Re-quantizes the GGUF decoder `src` into `dst` as `method` says, 4-bit groups rounded as
/// `rounding` says (GPTQ needs `calibration`); `progress(stage, done, total)` as it goes.
pub fn quantize_gguf(
    src: &Path,
    dst: &Path,
    method: Method,
    rounding: Rounding,
    calibration: Option<&Calibration<'_>>,
    mut progress: impl FnMut(Stage, usize, usize),
) -> Result<Quantized> {
    let g = GgufTensors::open(src)?;
    let h = g.header();
    let bad = |reason: String| Error::InvalidInput(format!("{}: {reason}", src.display()));
    let arch = h
        .metadata("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("")
        .to_string();
    if h.metadata(FFN_ROTATION_KEY).is_some() {
        return Err(bad(
            "already QuaRot with rotated down-projection inputs: quantize the original model"
                .into(),
        ));
    }
    let quarot = match method {
        Method::Quarot {
            weights,
            seed,
            online,
        } => {
            if !ARCHS.contains(&arch.as_str()) {
                return Err(bad(format!(
                    "QuaRot folds norms of the Llama layer structure ({}); `{arch}` is not one",
                    ARCHS.join(", ")
                )));
            }
            if !matches!(weights, QuantType::Q4_0 | QuantType::Q4_1 | QuantType::F32) {
                return Err(bad(format!(
                    "QuaRot layers are Q4_0, Q4_1 or F32, not {}",
                    weights.name()
                )));
            }
            let hidden = h
                .metadata(&format!("{arch}.embedding_length"))
                .and_then(GgufValue::as_u64)
                .ok_or_else(|| bad(format!("no `{arch}.embedding_length`")))?
                as usize;
            let rot = Rotation::new(hidden, seed).ok_or_else(|| {
                bad(format!(
                    "no Hadamard rotation of order {hidden} here (orders m · 2^k with a Paley \
                     order m)"
                ))
            })?;
            let ffn = if online {
                let inter = h
                    .metadata(&format!("{arch}.feed_forward_length"))
                    .and_then(GgufValue::as_u64)
                    .ok_or_else(|| bad(format!("no `{arch}.feed_forward_length`")))?
                    as usize;
                Some(Rotation::new(inter, seed ^ 0xFF).ok_or_else(|| {
                    bad(format!(
                        "no Hadamard rotation of order {inter} (the FFN width) here"
                    ))
                })?)
            } else {
                None
            };
            Some((rot, weights, ffn))
        }
        Method::Plain(_) => None,
    };
    let f32_of = |name: &str| -> Result<Dense> {
        let raw = g.raw(name)?;
        Ok(Dense {
            name: name.to_string(),
            dims: raw.info.dims.clone(),
            values: dequantize(&raw)?,
        })
    };
    let norm_of = |name: &str| -> Result<Vec<f32>> { Ok(f32_of(name)?.values) };

    let mut out: Vec<(Dense, QuantType)> = Vec::new();
    let mut bytes_before = 0u64;
    let total = h.tensors().len();
    let tied = !g.contains("output.weight");
    for (i, info) in h.tensors().iter().enumerate() {
        let name = info.name.as_str();
        bytes_before += info.n_bytes.unwrap_or(0);
        let mut t = f32_of(name)?;
        let is_matrix = t.dims.len() == 2;
        let qt = match (&quarot, method) {
            (None, Method::Plain(qt)) => {
                if is_matrix && t.dims[0] % qt.block_len() as u64 == 0 {
                    qt
                } else {
                    QuantType::F32
                }
            }
            (Some((rot, weights, ffn)), _) => {
                let (kind, layer) = tensor_kind(name);
                let cols = t.dims[0] as usize;
                let gamma = |norm: &str| -> Result<Vec<f32>> {
                    match layer {
                        Some(l) => norm_of(&format!("blk.{l}.{norm}.weight")),
                        None => norm_of(&format!("{norm}.weight")),
                    }
                };
                let head_type = if *weights == QuantType::F32 {
                    QuantType::F32
                } else {
                    QuantType::Q8_0
                };
                match kind {
                    Kind::Norm => {
                        t.values.fill(1.0);
                        QuantType::F32
                    }
                    Kind::Embedding => {
                        if tied {
                            // The head: the embedding with the final norm folded in, rotated.
                            let mut head = Dense {
                                name: "output.weight".into(),
                                dims: t.dims.clone(),
                                values: t.values.clone(),
                            };
                            scale_columns(&mut head.values, &gamma("output_norm")?);
                            rot.rotate_rows(&mut head.values);
                            out.push((head, head_type));
                        }
                        rot.rotate_rows(&mut t.values);
                        head_type
                    }
                    Kind::Head => {
                        scale_columns(&mut t.values, &gamma("output_norm")?);
                        rot.rotate_rows(&mut t.values);
                        head_type
                    }
                    Kind::Reads(norm) => {
                        scale_columns(&mut t.values, &gamma(norm)?);
                        rot.rotate_rows(&mut t.values);
                        *weights
                    }
                    Kind::Writes => {
                        rot.rotate_columns(&mut t.values, cols);
                        if let (Some(f), true) = (ffn, name.ends_with("ffn_down.weight")) {
                            // Its input is rotated at run time by `f`: W ← W · f.
                            f.rotate_rows(&mut t.values);
                        }
                        *weights
                    }
                    Kind::WritesBias => {
                        rot.rotate_rows(&mut t.values);
                        QuantType::F32
                    }
                    Kind::Untouched => QuantType::F32,
                    Kind::Unknown => {
                        return Err(bad(format!(
                            "tensor `{name}`: QuaRot does not know where it sits in the layer"
                        )))
                    }
                }
            }
            _ => unreachable!("quarot is set exactly for Method::Quarot"),
        };
        out.push((t, qt));
        progress(Stage::Rewrite, i + 1, total);
    }
    let mut metadata: Vec<(String, GgufValue)> = h
        .metadata_entries()
        .filter(|(k, _)| *k != "general.file_type" && !k.starts_with("lattice.quantize."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    if let Method::Quarot {
        seed, online: true, ..
    } = method
    {
        metadata.push((FFN_ROTATION_KEY.into(), GgufValue::U64(seed ^ 0xFF)));
    }
    if rounding == Rounding::Gptq
        && !out
            .iter()
            .any(|(_, qt)| matches!(qt, QuantType::Q4_0 | QuantType::Q4_1))
    {
        return Err(bad(
            "GPTQ rounds 4-bit blocks (Q4_0 / Q4_1) and this method writes none".into(),
        ));
    }
    let hessians = match (rounding, calibration) {
        (Rounding::Gptq, Some(cal)) => Some(calibrate(
            dst,
            &metadata,
            &out,
            h.alignment(),
            cal,
            &mut progress,
        )?),
        (Rounding::Gptq, None) => {
            return Err(Error::InvalidInput(
                "GPTQ rounding needs a calibration text".into(),
            ))
        }
        (_, Some(_)) => {
            return Err(Error::InvalidInput(
                "a calibration text is used by GPTQ rounding only".into(),
            ))
        }
        (_, None) => None,
    };
    let mut blobs: Vec<(String, Vec<u64>, u32, Vec<u8>)> = Vec::with_capacity(out.len());
    for (done, (t, qt)) in out.iter().enumerate() {
        let row = t.dims[0] as usize;
        let row_bytes = qt.row_bytes(row).ok_or_else(|| {
            bad(format!(
                "tensor `{}`: rows of {row} for {}",
                t.name,
                qt.name()
            ))
        })?;
        let four_bit = matches!(qt, QuantType::Q4_0 | QuantType::Q4_1);
        let hessian = match (&hessians, four_bit) {
            (Some(hs), true)
                if !matches!(t.name.as_str(), "token_embd.weight" | "output.weight") =>
            {
                let prefix = t.name.strip_suffix(".weight").unwrap_or(&t.name);
                Some(hs.get(prefix).ok_or_else(|| {
                    bad(format!(
                        "tensor `{}`: no calibration input reached it (GPTQ needs its layer's \
                         inputs)",
                        t.name
                    ))
                })?)
            }
            _ => None,
        };
        let bytes = match hessian {
            Some(hess) => gptq::quantize_matrix(*qt, &t.values, &hess)
                .map_err(|e| bad(format!("tensor `{}`: {e}", t.name)))?,
            None => {
                let mut bytes = vec![0u8; t.values.len() / row.max(1) * row_bytes];
                let search = rounding != Rounding::Nearest && four_bit;
                let mut rows: Vec<(&[f32], &mut [u8])> = t
                    .values
                    .chunks_exact(row.max(1))
                    .zip(bytes.chunks_exact_mut(row_bytes.max(1)))
                    .collect();
                let results: Vec<Result<()>> =
                    crate::ops::par_map_mut(&mut rows, true, |(s, d)| {
                        if search {
                            search::quantize_row_searched(*qt, s, d);
                            Ok(())
                        } else {
                            quantize_row(*qt, s, d)
                        }
                    });
                results.into_iter().collect::<Result<()>>()?;
                bytes
            }
        };
        blobs.push((t.name.clone(), t.dims.clone(), qt.ggml_type(), bytes));
        progress(Stage::Encode, done + 1, out.len());
    }
    let (method_name, seed) = match method {
        Method::Plain(qt) => (qt.name().to_string(), None),
        Method::Quarot { weights, seed, .. } => (format!("quarot-{}", weights.name()), Some(seed)),
    };
    if hessians.is_some() {
        metadata.push((
            "lattice.quantize.rounding".into(),
            GgufValue::String("gptq".into()),
        ));
    }
    metadata.push((
        "lattice.quantize.method".into(),
        GgufValue::String(method_name),
    ));
    if let Some(s) = seed {
        metadata.push(("lattice.quantize.seed".into(), GgufValue::U64(s)));
    }
    let tensors: Vec<TensorOut<'_>> = blobs
        .iter()
        .map(|(name, dims, ty, bytes)| TensorOut {
            name: name.clone(),
            dims: dims.clone(),
            ggml_type: *ty,
            bytes,
        })
        .collect();
    write_gguf(dst, &metadata, &tensors, h.alignment())?;
    Ok(Quantized {
        bytes_before,
        bytes_after: blobs.iter().map(|b| b.3.len() as u64).sum(),
        tensors: blobs.len(),
    })
}

/// Where a tensor sits relative to the residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An RMSNorm scale on the stream (folded away: becomes 1).
    Norm,
    /// `token_embd`: writes the stream.
    Embedding,
    /// `output`: reads the final-normed stream.
    Head,
    /// Reads the stream normalized by this norm (`attn_norm` or `ffn_norm`).
    Reads(&'static str),
    /// Writes the stream (`attn_output`, `ffn_down`): `Qᵀ · W`.
    Writes,
    /// A bias added to the stream: rotated like a row.
    WritesBias,
    /// Not on the stream (biases of Q/K/V, per-head Q/K norms).
    Untouched,
    /// Anything else.
    Unknown,
}

/// The kind of tensor `name` and its layer.
fn tensor_kind(name: &str) -> (Kind, Option<usize>) {
    match name {
        "token_embd.weight" => return (Kind::Embedding, None),
        "output.weight" => return (Kind::Head, None),
        "output_norm.weight" => return (Kind::Norm, None),
        _ => {}
    }
    let Some((layer, rest)) = name
        .strip_prefix("blk.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(l, rest)| Some((l.parse::<usize>().ok()?, rest)))
    else {
        return (Kind::Unknown, None);
    };
    let kind = match rest {
        "attn_norm.weight" | "ffn_norm.weight" => Kind::Norm,
        "attn_q.weight" | "attn_k.weight" | "attn_v.weight" => Kind::Reads("attn_norm"),
        "ffn_gate.weight" | "ffn_up.weight" => Kind::Reads("ffn_norm"),
        "attn_output.weight" | "ffn_down.weight" => Kind::Writes,
        "attn_output.bias" | "ffn_down.bias" => Kind::WritesBias,
        "attn_q.bias" | "attn_k.bias" | "attn_v.bias" | "attn_q_norm.weight"
        | "attn_k_norm.weight" | "ffn_gate.bias" | "ffn_up.bias" => Kind::Untouched,
        _ => Kind::Unknown,
    };
    (kind, Some(layer))
}

/// Runs the rewritten f32 model `out` over the calibration text and returns every layer's
/// input Hessian. The model is written to a temporary GGUF beside `dst` (removed after) and
/// loaded with a [`Hessians`] probe on its projections.
fn calibrate(
    dst: &Path,
    metadata: &[(String, GgufValue)],
    out: &[(Dense, QuantType)],
    alignment: u64,
    cal: &Calibration<'_>,
    progress: &mut impl FnMut(Stage, usize, usize),
) -> Result<Arc<Hessians>> {
    /// Removes the temporary model however calibration ends.
    struct TempFile(PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let mut name = dst.file_name().unwrap_or_default().to_os_string();
    name.push(".calibration.tmp");
    let tmp = TempFile(dst.with_file_name(name));
    let tensors: Vec<TensorOut<'_>> = out
        .iter()
        .map(|(t, _)| TensorOut {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: QuantType::F32.ggml_type(),
            bytes: bytemuck::cast_slice(&t.values),
        })
        .collect();
    write_gguf(&tmp.0, metadata, &tensors, alignment)?;
    drop(tensors);
    let hessians = Arc::new(Hessians::new());
    let mut place = Placement::new(WeightMode::F32, Device::Cpu);
    place.probe = Some(Arc::clone(&hessians) as _);
    let model = TextModel::load_on(&tmp.0, &place)?;
    let need = hessians.bytes_needed();
    if let Some(free) = crate::engine::available_memory() {
        if need > free {
            return Err(Error::InvalidInput(format!(
                "GPTQ holds every layer's input Hessian while calibrating: {:.1} GB, and {:.1} GB \
                 of memory is available (quantize this model on a machine with more memory, or \
                 use --rounding mse)",
                need as f64 / 1e9,
                free as f64 / 1e9
            )));
        }
    }
    let ctx = cal.ctx.max(1);
    let max_ctx = model.decoder.info().config.max_positions;
    if max_ctx > 0 && ctx > max_ctx {
        return Err(Error::InvalidInput(format!(
            "calibration chunks of {ctx} tokens are longer than the model's context ({max_ctx})"
        )));
    }
    let mut tokens = model.encode_prompt(cal.text, true)?;
    tokens.truncate((cal.tokens / ctx).max(1) * ctx);
    crate::prune::run_calibration(
        model.decoder.as_ref(),
        |n| model.new_cache(n),
        &tokens,
        ctx,
        |done, total| progress(Stage::Calibrate, done, total),
    )?;
    Ok(hessians)
}

/// `W ← W · diag(γ)` for `w` [rows, γ.len()].
fn scale_columns(w: &mut [f32], gamma: &[f32]) {
    for row in w.chunks_exact_mut(gamma.len().max(1)) {
        for (v, g) in row.iter_mut().zip(gamma) {
            *v *= g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_parse_and_tensors_are_classified() {
        for name in Method::NAMES {
            assert!(Method::parse(name, 1).is_some(), "{name}");
        }
        assert!(Method::parse("q4_k", 1).is_none());
        assert_eq!(
            tensor_kind("blk.3.attn_k.weight"),
            (Kind::Reads("attn_norm"), Some(3))
        );
        assert_eq!(
            tensor_kind("blk.0.ffn_down.weight"),
            (Kind::Writes, Some(0))
        );
        assert_eq!(tensor_kind("blk.0.attn_q.bias"), (Kind::Untouched, Some(0)));
        assert_eq!(tensor_kind("token_embd.weight"), (Kind::Embedding, None));
        assert_eq!(tensor_kind("blk.x.attn_k.weight").0, Kind::Unknown);
        assert_eq!(tensor_kind("rope_freqs.weight").0, Kind::Unknown);
    }
}
