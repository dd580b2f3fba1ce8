//! The hybrid settings of a decoder whose layers mix Gated DeltaNet (linear attention) and full
//! attention (Qwen3.5): the GDN head layout, the convolution kernel and which layers are full
//! attention, read from a transformers `config.json` (`text_config`) or from GGUF metadata
//! (`{arch}.ssm.*`, where llama.cpp's converter also tiles the value heads). Part of
//! [`DecoderConfig`](super::decoder::DecoderConfig); model files never read formats.

use crate::attention::gdn::GdnHeads;
use crate::io::gguf::{GgufArray, GgufFile};

/// The hybrid settings: linear-attention hyper-parameters and the layer kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HybridConfig {
    /// The Gated DeltaNet layers' shape.
    pub gdn: GdnConfig,
    /// Per layer: `true` for full attention, `false` for Gated DeltaNet.
    pub full_attention: Vec<bool>,
}

impl HybridConfig {
    /// From a transformers `config.json` (its `text_config` when there is one).
    pub(crate) fn from_hf_json(
        v: &serde_json::Value,
        n_layers: usize,
    ) -> std::result::Result<Self, String> {
        let (gdn, full_attention) = read_hybrid(v, n_layers)?;
        Ok(Self {
            gdn,
            full_attention,
        })
    }

    /// From GGUF metadata.
    pub(crate) fn from_gguf(f: &GgufFile, n_layers: usize) -> std::result::Result<Self, String> {
        let (gdn, full_attention) = read_hybrid_gguf(f, n_layers)?;
        Ok(Self {
            gdn,
            full_attention,
        })
    }
}

/// The linear-attention hyper-parameters of `text_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdnConfig {
    /// Head layout.
    pub heads: GdnHeads,
    /// Convolution kernel size.
    pub conv_kernel: usize,
}

impl GdnConfig {
    /// Channels of the convolution: Q, K and V side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.heads.key_dim() + self.heads.value_dim()
    }
}

/// Reads the GDN settings and the per-layer kinds (`true` = full attention) from config.json.
fn read_hybrid(
    v: &serde_json::Value,
    n_layers: usize,
) -> std::result::Result<(GdnConfig, Vec<bool>), String> {
    let t = v.get("text_config").filter(|t| t.is_object()).unwrap_or(v);
    let num = |k: &str, default: Option<u64>| -> std::result::Result<usize, String> {
        t.get(k)
            .and_then(serde_json::Value::as_u64)
            .or(default)
            .map(|x| x as usize)
            .ok_or_else(|| format!("missing `{k}`"))
    };
    let gdn = GdnConfig {
        heads: GdnHeads {
            n_k_heads: num("linear_num_key_heads", Some(16))?,
            n_v_heads: num("linear_num_value_heads", Some(32))?,
            k_dim: num("linear_key_head_dim", Some(128))?,
            v_dim: num("linear_value_head_dim", Some(128))?,
            v_tiled: false,
        },
        conv_kernel: num("linear_conv_kernel_dim", Some(4))?,
    };
    let heads = &gdn.heads;
    if heads.n_k_heads == 0
        || !heads.n_v_heads.is_multiple_of(heads.n_k_heads)
        || heads.k_dim == 0
        || heads.v_dim == 0
    {
        return Err(format!(
            "linear attention: {} value heads cannot share {} key heads (widths {} / {})",
            heads.n_v_heads, heads.n_k_heads, heads.k_dim, heads.v_dim
        ));
    }
    if !(1..=64).contains(&gdn.conv_kernel) {
        return Err(format!(
            "linear_conv_kernel_dim {} is out of range",
            gdn.conv_kernel
        ));
    }
    let full: Vec<bool> = match t.get("layer_types").and_then(serde_json::Value::as_array) {
        Some(a) => a
            .iter()
            .map(|x| match x.as_str() {
                Some("full_attention") => Ok(true),
                Some("linear_attention") => Ok(false),
                other => Err(format!("unknown layer type {other:?}")),
            })
            .collect::<std::result::Result<_, _>>()?,
        None => {
            let every = num("full_attention_interval", Some(4))?.max(1);
            (0..n_layers).map(|i| (i + 1) % every == 0).collect()
        }
    };
    if full.len() != n_layers {
        return Err(format!(
            "layer_types lists {} layers, the model has {n_layers}",
            full.len()
        ));
    }
    Ok((gdn, full))
}

/// [`read_hybrid`] for GGUF metadata (`{arch}.ssm.*`, `{arch}.attention.recurrent_layers` or
/// `{arch}.full_attention_interval`), every GDN key required.
fn read_hybrid_gguf(
    f: &GgufFile,
    n_layers: usize,
) -> std::result::Result<(GdnConfig, Vec<bool>), String> {
    let arch = f
        .metadata("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("qwen35");
    let num = |k: &str| -> std::result::Result<u64, String> {
        f.metadata(&format!("{arch}.{k}"))
            .and_then(|v| v.as_u64())
            .ok_or_else(|| format!("missing `{arch}.{k}`"))
    };
    let n_v = num("ssm.time_step_rank")?;
    let mut t = serde_json::json!({
        "linear_num_key_heads": num("ssm.group_count")?,
        "linear_num_value_heads": n_v,
        "linear_key_head_dim": num("ssm.state_size")?,
        "linear_value_head_dim": num("ssm.inner_size")?.checked_div(n_v).unwrap_or(0),
        "linear_conv_kernel_dim": num("ssm.conv_kernel")?,
    });
    match f.metadata(&format!("{arch}.attention.recurrent_layers")) {
        // Converted files may list trailing multi-token-prediction layers too.
        Some(v) => match v.as_array() {
            Some(GgufArray::Bool(r)) if r.len() >= n_layers => {
                let kinds = r[..n_layers].iter().map(|&rec| {
                    if rec {
                        "linear_attention"
                    } else {
                        "full_attention"
                    }
                });
                t["layer_types"] = kinds.collect::<Vec<_>>().into();
            }
            _ => {
                return Err(format!(
                    "`{arch}.attention.recurrent_layers` must list {n_layers} booleans"
                ))
            }
        },
        None => t["full_attention_interval"] = num("full_attention_interval")?.into(),
    }
    let (mut gdn, full) = read_hybrid(&t, n_layers)?;
    gdn.heads.v_tiled = true;
    Ok((gdn, full))
}
