//! Qwen3.5: a hybrid decoder whose `layer_types` mix Gated DeltaNet layers (linear attention
//! with a recurrent state; three of every four) and full-attention layers with a sigmoid output
//! gate. Both use zero-centred `(1 + w)` RMSNorms, per-head Q/K norms, partial RoPE (a quarter of
//! each head) and the SwiGLU MLP; the text model of the multimodal checkpoints
//! (`model.language_model.*`) or of a causal-LM save (`model.*`).
//!
//! A GDN layer: `in_proj_qkv` → causal depthwise conv1d (kernel 4, rolling window) → SiLU →
//! split Q, K, V; L2-normalized Q, K; `β = σ(b)`, `g = −exp(A_log) · softplus(a + dt_bias)`;
//! the gated delta rule per value head ([`crate::attention::gdn`]: chunked for prompts,
//! token by token for decoding); a gated RMSNorm `w ⊙ norm(o) ⊙ silu(z)`; `out_proj`.
//!
//! Also loads llama.cpp's GGUF files (arch `qwen35`): hybrid settings from `qwen35.ssm.*` and
//! `qwen35.attention.recurrent_layers`, and (when value heads outnumber key heads) the value
//! heads in tiled order; the converter's value transforms (`1 + w` norms, `ssm_a = −exp(A_log)`,
//! a 2-D conv kernel) are undone by the [`TensorSource`].
//!
//! A pass runs every projection over the packed rows of all sequences at once; only the
//! convolution and delta rule (over each sequence's recurrent state) and the attention (over
//! each sequence's cache; one batched call when every sequence decodes one token) run per
//! sequence.

use crate::attention::gdn::{delta_rule_heads, log_decay, GdnHeads, GdnInputs};
use crate::attention::{attend, CausalShape};
use crate::io::gguf::{GgufArray, GgufFile};
use crate::ops::{
    causal_conv1d, l2_normalize_rows, scale, sigmoid, sigmoid_gate, silu, silu_gate, silu_mul,
    split_columns, Linear, RmsNorm, Rope,
};
use crate::state::{LayerKind, SeqState};
use crate::{Error, Result};

use super::batch::ForwardBatch;
use super::decoder::{embed_rows, finish_batch, Decoder, DecoderConfig, DecoderInfo};
use super::source::{EmbeddingTable, TensorSource, WeightMode};

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
    fn conv_dim(&self) -> usize {
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

#[derive(Debug)]
struct Gdn {
    in_proj: Linear, // [conv_dim + value_dim + 2 n_v_heads, hidden]: qkv, z, b, a
    conv: Vec<f32>,  // [conv_dim, kernel]
    a_log_exp: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: RmsNorm, // [v_dim], plain weight
    out_proj: Linear,
}

#[derive(Debug)]
struct GatedAttention {
    q_proj: Linear, // [2 q_dim]: per head, query then gate
    kv_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
}

#[derive(Debug)]
enum Mixer {
    Linear(Gdn),
    Full(GatedAttention),
}

#[derive(Debug)]
struct Layer {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_norm: RmsNorm,
    gate_up: Linear,
    down: Linear,
}

/// A Qwen3.5 text decoder.
#[derive(Debug)]
pub struct Qwen35Model {
    info: DecoderInfo,
    gdn: GdnConfig,
    kinds: Vec<LayerKind>,
    embed: EmbeddingTable,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

/// A zero-centred RMSNorm, holding its scale `1 + w`.
fn offset_norm(src: &TensorSource, prefix: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
    Ok(RmsNorm::new(src.zero_centred_norm(prefix, dim)?, eps))
}

impl Qwen35Model {
    /// Loads the text model described by `cfg` (and the hybrid settings of config.json or of
    /// the GGUF metadata) from `src`.
    pub fn load(cfg: DecoderConfig, src: &TensorSource, mode: WeightMode) -> Result<Self> {
        let (gdn, full) = match src {
            TensorSource::Gguf(g) => read_hybrid_gguf(g.header(), cfg.n_layers)
                .map_err(|reason| (g.header().path().to_path_buf(), reason)),
            TensorSource::Safetensors {
                config,
                config_path,
                ..
            } => read_hybrid(config, cfg.n_layers).map_err(|reason| (config_path.clone(), reason)),
        }
        .map_err(|(path, reason)| Error::InvalidConfig { path, reason })?;
        let (h, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
        let (q_dim, kv_dim, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let embed = src.embedding("model.embed_tokens", cfg.vocab_size, h, mode)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        let mut kinds = Vec::with_capacity(cfg.n_layers);
        for (i, &is_full) in full.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let mixer = if is_full {
                kinds.push(LayerKind::Attention);
                let a = format!("{p}.self_attn");
                let (q, k, v, o) = (
                    format!("{a}.q_proj"),
                    format!("{a}.k_proj"),
                    format!("{a}.v_proj"),
                    format!("{a}.o_proj"),
                );
                let bias = cfg.qkv_bias;
                Mixer::Full(GatedAttention {
                    q_proj: src.linear(&[&q], &[2 * q_dim], h, bias, mode, &[])?,
                    kv_proj: src.linear(&[&k, &v], &[kv_dim, kv_dim], h, bias, mode, &[])?,
                    q_norm: offset_norm(src, &format!("{a}.q_norm"), hd, eps)?,
                    k_norm: offset_norm(src, &format!("{a}.k_norm"), hd, eps)?,
                    o_proj: src.linear(&[&o], &[h], q_dim, cfg.o_bias, mode, &[])?,
                })
            } else {
                let a = format!("{p}.linear_attn");
                let (conv_dim, heads) = (gdn.conv_dim(), &gdn.heads);
                let (vd, nv) = (heads.value_dim(), heads.n_v_heads);
                kinds.push(LayerKind::Recurrent {
                    conv: (gdn.conv_kernel - 1) * conv_dim,
                    recurrent: heads.state_len(),
                });
                let names = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
                    .map(|n| format!("{a}.{n}"));
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                Mixer::Linear(Gdn {
                    in_proj: src.linear(&refs, &[conv_dim, vd, nv, nv], h, false, mode, &[])?,
                    conv: src.conv_kernel(&format!("{a}.conv1d"), conv_dim, gdn.conv_kernel)?,
                    a_log_exp: src.a_log_exp(&a, nv)?,
                    dt_bias: src.f32(&a, "dt_bias", &[nv])?.as_slice().to_vec(),
                    norm: RmsNorm::new(
                        src.f32(&format!("{a}.norm"), "weight", &[heads.v_dim])?,
                        eps,
                    ),
                    out_proj: src.linear(
                        &[&format!("{a}.out_proj")],
                        &[h],
                        vd,
                        false,
                        mode,
                        &[],
                    )?,
                })
            };
            let mlp = format!("{p}.mlp");
            layers.push(Layer {
                input_norm: offset_norm(src, &format!("{p}.input_layernorm"), h, eps)?,
                mixer,
                post_norm: offset_norm(src, &format!("{p}.post_attention_layernorm"), h, eps)?,
                gate_up: src.linear(
                    &[&format!("{mlp}.gate_proj"), &format!("{mlp}.up_proj")],
                    &[inter, inter],
                    h,
                    false,
                    mode,
                    &[],
                )?,
                down: src.linear(
                    &[&format!("{mlp}.down_proj")],
                    &[h],
                    inter,
                    false,
                    mode,
                    &[],
                )?,
            });
        }
        let norm = offset_norm(src, "model.norm", h, eps)?;
        let lm_head = if cfg.tie_word_embeddings && !src.contains("lm_head", "weight") {
            embed.to_linear(mode)?
        } else {
            src.linear(&["lm_head"], &[cfg.vocab_size], h, false, mode, &[])?
        };
        let rope = Rope::new(&cfg.rope, hd)?;
        let weight_bytes = layers
            .iter()
            .map(|l| {
                let mixer = match &l.mixer {
                    Mixer::Linear(g) => g.in_proj.weight_bytes() + g.out_proj.weight_bytes(),
                    Mixer::Full(a) => {
                        a.q_proj.weight_bytes() + a.kv_proj.weight_bytes() + a.o_proj.weight_bytes()
                    }
                };
                mixer + l.gate_up.weight_bytes() + l.down.weight_bytes()
            })
            .sum::<usize>()
            + lm_head.weight_bytes();
        Ok(Self {
            info: DecoderInfo {
                config: cfg,
                weight_mode: mode,
                weight_bytes,
            },
            gdn,
            kinds,
            embed,
            layers,
            norm,
            lm_head,
            rope,
        })
    }

    fn config(&self) -> &DecoderConfig {
        &self.info.config
    }

    /// A GDN layer over the packed new tokens of every sequence (`hn` the normalized residual
    /// stream `x`); returns `x` plus the layer's output.
    fn gdn(
        &self,
        layer: usize,
        g: &Gdn,
        hn: &[f32],
        x: &[f32],
        lens: &[usize],
        caches: &mut [&mut SeqState],
    ) -> Vec<f32> {
        let (c, heads) = (&self.gdn, &self.gdn.heads);
        let (conv_dim, kd, vd, nv) = (
            c.conv_dim(),
            heads.key_dim(),
            heads.value_dim(),
            heads.n_v_heads,
        );
        let [qkv, z, mut beta, a] = split_columns(&g.in_proj.forward(hn), [conv_dim, vd, nv, nv]);
        sigmoid(&mut beta);
        let decay = log_decay(&a, &g.a_log_exp, &g.dt_bias);
        let q_scale = 1.0 / (heads.k_dim as f32).sqrt();

        let mut core = Vec::with_capacity(z.len());
        let mut row0 = 0;
        for (&n, cache) in lens.iter().zip(caches.iter_mut()) {
            let rows = row0..row0 + n;
            row0 += n;
            let (conv_state, rec_state) = cache.recurrent(layer);
            // Causal depthwise convolution over [window; new inputs], then SiLU.
            let mut inputs = Vec::with_capacity(conv_state.len() + n * conv_dim);
            inputs.extend_from_slice(conv_state);
            inputs.extend_from_slice(&qkv[rows.start * conv_dim..rows.end * conv_dim]);
            let mut mixed = causal_conv1d(&inputs, &g.conv, conv_dim, c.conv_kernel);
            silu(&mut mixed);
            let new_conv = inputs[n * conv_dim..].to_vec();

            let [mut q, mut k, v] = split_columns(&mixed, [kd, kd, vd]);
            l2_normalize_rows(&mut q, heads.k_dim, 1e-6);
            l2_normalize_rows(&mut k, heads.k_dim, 1e-6);
            scale(&mut q, q_scale);
            let per_head = rows.start * nv..rows.end * nv;
            let x = GdnInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &decay[per_head.clone()],
                beta: &beta[per_head],
            };
            let (o, new_state) = delta_rule_heads(&x, heads, rec_state);
            cache.set_recurrent(layer, new_conv, new_state);
            core.extend(o);
        }

        // Gated RMSNorm per head: w ⊙ norm(o) ⊙ silu(z).
        g.norm.forward_inplace(&mut core);
        silu_gate(&mut core, &z);
        g.out_proj.forward_residual(&core, x)
    }

    /// A gated full-attention layer over the packed new tokens of every sequence (`hn` the
    /// normalized residual stream `x`, at `positions`); returns `x` plus the layer's output.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: usize,
        a: &GatedAttention,
        hn: &[f32],
        x: &[f32],
        lens: &[usize],
        positions: &[usize],
        caches: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        let (hd, kv_dim) = (cfg.head_dim, cfg.kv_dim());
        // q_proj holds a query and a gate per head.
        let [mut q, gate] = split_columns(&a.q_proj.forward(hn), [hd, hd]);
        let [mut k, v] = split_columns(&a.kv_proj.forward(hn), [kv_dim, kv_dim]);
        a.q_norm.forward_inplace(&mut q);
        a.k_norm.forward_inplace(&mut k);
        self.rope.apply(&mut q, cfg.n_heads, positions);
        self.rope.apply(&mut k, cfg.n_kv_heads, positions);
        let shape = CausalShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            sliding_window: None,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let mut ctx = attend(&q, &k, &v, lens, caches, layer, &shape, scale)?;
        sigmoid_gate(&mut ctx, &gate);
        Ok(a.o_proj.forward_residual(&ctx, x))
    }
}

impl Decoder for Qwen35Model {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn new_cache(&self, max_len: usize) -> SeqState {
        let cfg = self.config();
        SeqState::with_layers(&self.kinds, cfg.kv_dim(), max_len.min(cfg.max_positions))
    }

    fn forward_on_pool(
        &self,
        batch: &ForwardBatch<'_>,
        caches: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        let positions = batch.validate(caches, cfg.kv_dim(), cfg.hidden_size, false)?;
        let lens = &batch.seq_lens;
        let mut x = embed_rows(&self.embed, batch, cfg.hidden_size)?;
        for (layer, l) in self.layers.iter().enumerate() {
            let mut hn = x.clone();
            l.input_norm.forward_inplace(&mut hn);
            x = match &l.mixer {
                Mixer::Linear(g) => self.gdn(layer, g, &hn, &x, lens, caches),
                Mixer::Full(a) => self.attention(layer, a, &hn, &x, lens, &positions, caches)?,
            };
            let mut hn = x.clone();
            l.post_norm.forward_inplace(&mut hn);
            let act = silu_mul(&l.gate_up.forward(&hn), cfg.intermediate_size);
            x = l.down.forward_residual(&act, &x);
        }
        finish_batch(x, batch, caches, &self.norm, Some(&self.lm_head))
    }
}
