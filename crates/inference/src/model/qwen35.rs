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
//! `qwen35.attention.recurrent_layers`; the converter stores `1 + w` norms, `ssm_a = −exp(A_log)`,
//! a 2-D conv kernel, and (when value heads outnumber key heads) the value heads in tiled order.

use rayon::prelude::*;

use crate::attention::gdn::{delta_rule_chunked, delta_rule_sequential, HeadInputs};
use crate::attention::{cached_attention, CausalShape};
use crate::io::gguf::{GgufArray, GgufFile};
use crate::io::store::Weight;
use crate::ops::{
    causal_conv1d, l2_normalize_rows, silu, silu_mul, softplus, Linear, RmsNorm, Rope,
};
use crate::state::{LayerKind, SeqState};
use crate::{Error, Result};

use super::decoder::{
    batch_positions, embed_tokens, finish_batch, Decoder, DecoderConfig, DecoderInfo, Outputs,
};
use super::source::{EmbeddingTable, TensorSource, WeightMode};

/// Prompts shorter than this run the delta rule token by token.
const MIN_CHUNKED: usize = 8;

/// The linear-attention hyper-parameters of `text_config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdnConfig {
    /// Key heads.
    pub n_k_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub n_v_heads: usize,
    /// Key head width.
    pub k_dim: usize,
    /// Value head width.
    pub v_dim: usize,
    /// Convolution kernel size.
    pub conv_kernel: usize,
    /// Value heads in llama.cpp's tiled order (head `h` reads key head `h % n_k_heads`) instead
    /// of transformers' grouping by key head (`h / (n_v_heads / n_k_heads)`).
    pub v_tiled: bool,
}

impl GdnConfig {
    /// The key head value head `h` reads.
    fn key_head(&self, h: usize) -> usize {
        if self.v_tiled {
            h % self.n_k_heads
        } else {
            h / (self.n_v_heads / self.n_k_heads)
        }
    }
    fn key_dim(&self) -> usize {
        self.n_k_heads * self.k_dim
    }
    fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_dim
    }
    /// Channels of the convolution: Q, K and V side by side.
    fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
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
        n_k_heads: num("linear_num_key_heads", Some(16))?,
        n_v_heads: num("linear_num_value_heads", Some(32))?,
        k_dim: num("linear_key_head_dim", Some(128))?,
        v_dim: num("linear_value_head_dim", Some(128))?,
        conv_kernel: num("linear_conv_kernel_dim", Some(4))?,
        v_tiled: false,
    };
    if gdn.n_k_heads == 0
        || !gdn.n_v_heads.is_multiple_of(gdn.n_k_heads)
        || gdn.k_dim == 0
        || gdn.v_dim == 0
    {
        return Err(format!(
            "linear attention: {} value heads cannot share {} key heads (widths {} / {})",
            gdn.n_v_heads, gdn.n_k_heads, gdn.k_dim, gdn.v_dim
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
    gdn.v_tiled = true;
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
struct Block {
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
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

/// A zero-centred RMSNorm: stores `1 + w` (GGUF files hold `1 + w` already).
fn offset_norm(src: &TensorSource, prefix: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
    let w = src.f32(prefix, "weight", &[dim])?;
    let one = if matches!(src, TensorSource::Gguf(_)) {
        0.0
    } else {
        1.0
    };
    let shifted: Vec<f32> = w.as_slice().iter().map(|x| one + x).collect();
    Ok(RmsNorm::new(Weight::from_vec(shifted, vec![dim]), eps))
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
        let gguf = matches!(src, TensorSource::Gguf(_));
        let (h, hd, eps) = (cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps);
        let (q_dim, kv_dim, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let embed = src.embedding("model.embed_tokens", cfg.vocab_size, h, mode)?;
        let mut blocks = Vec::with_capacity(cfg.n_layers);
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
                let conv_dim = gdn.conv_dim();
                kinds.push(LayerKind::Recurrent {
                    conv: (gdn.conv_kernel - 1) * conv_dim,
                    recurrent: gdn.n_v_heads * gdn.k_dim * gdn.v_dim,
                });
                let names = ["in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"]
                    .map(|n| format!("{a}.{n}"));
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                let conv_shape = if gguf {
                    vec![conv_dim, gdn.conv_kernel]
                } else {
                    vec![conv_dim, 1, gdn.conv_kernel]
                };
                let conv = src
                    .f32(&format!("{a}.conv1d"), "weight", &conv_shape)?
                    .as_slice()
                    .to_vec();
                // GGUF's `ssm_a` holds −exp(A_log).
                let a_log = src.f32(&a, "A_log", &[gdn.n_v_heads])?;
                let a_log_exp = a_log
                    .as_slice()
                    .iter()
                    .map(|&x| if gguf { -x } else { x.exp() })
                    .collect();
                Mixer::Linear(Gdn {
                    in_proj: src.linear(
                        &refs,
                        &[conv_dim, gdn.value_dim(), gdn.n_v_heads, gdn.n_v_heads],
                        h,
                        false,
                        mode,
                        &[],
                    )?,
                    conv,
                    a_log_exp,
                    dt_bias: src
                        .f32(&a, "dt_bias", &[gdn.n_v_heads])?
                        .as_slice()
                        .to_vec(),
                    norm: RmsNorm::new(src.f32(&format!("{a}.norm"), "weight", &[gdn.v_dim])?, eps),
                    out_proj: src.linear(
                        &[&format!("{a}.out_proj")],
                        &[h],
                        gdn.value_dim(),
                        false,
                        mode,
                        &[],
                    )?,
                })
            };
            let mlp = format!("{p}.mlp");
            blocks.push(Block {
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
        let weight_bytes = blocks
            .iter()
            .map(|b| {
                let mixer = match &b.mixer {
                    Mixer::Linear(g) => g.in_proj.weight_bytes() + g.out_proj.weight_bytes(),
                    Mixer::Full(a) => {
                        a.q_proj.weight_bytes() + a.kv_proj.weight_bytes() + a.o_proj.weight_bytes()
                    }
                };
                mixer + b.gate_up.weight_bytes() + b.down.weight_bytes()
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
            blocks,
            norm,
            lm_head,
            rope,
        })
    }

    fn config(&self) -> &DecoderConfig {
        &self.info.config
    }

    /// A GDN layer over the `n` new tokens of one sequence (`x` already normalized).
    fn gdn(&self, layer: usize, g: &Gdn, x: &[f32], state: &mut SeqState) -> Vec<f32> {
        let c = &self.gdn;
        let (conv_dim, vd, nv, kk) = (c.conv_dim(), c.value_dim(), c.n_v_heads, c.conv_kernel);
        let width = conv_dim + vd + 2 * nv;
        let proj = g.in_proj.forward(x);
        let n = proj.len() / width;
        let (conv_state, rec_state) = state.recurrent(layer);

        // Causal depthwise convolution over [window; new inputs], then SiLU.
        let mut inputs = Vec::with_capacity((kk - 1 + n) * conv_dim);
        inputs.extend_from_slice(conv_state);
        for row in proj.chunks_exact(width) {
            inputs.extend_from_slice(&row[..conv_dim]);
        }
        let mut mixed = causal_conv1d(&inputs, &g.conv, conv_dim, kk);
        silu(&mut mixed);
        let new_conv = inputs[n * conv_dim..].to_vec();

        // Split, normalize, gates.
        let (kd, dk, dv) = (c.key_dim(), c.k_dim, c.v_dim);
        let mut q = Vec::with_capacity(n * kd);
        let mut k = Vec::with_capacity(n * kd);
        let mut v = Vec::with_capacity(n * vd);
        for row in mixed.chunks_exact(conv_dim) {
            q.extend_from_slice(&row[..kd]);
            k.extend_from_slice(&row[kd..2 * kd]);
            v.extend_from_slice(&row[2 * kd..]);
        }
        l2_normalize_rows(&mut q, dk, 1e-6);
        l2_normalize_rows(&mut k, dk, 1e-6);
        let scale = 1.0 / (dk as f32).sqrt();
        q.iter_mut().for_each(|x| *x *= scale);
        let mut beta = vec![0.0f32; n * nv];
        let mut decay = vec![0.0f32; n * nv];
        for (t, row) in proj.chunks_exact(width).enumerate() {
            let b = &row[conv_dim + vd..conv_dim + vd + nv];
            let a = &row[conv_dim + vd + nv..];
            for hh in 0..nv {
                beta[t * nv + hh] = 1.0 / (1.0 + (-b[hh]).exp());
                decay[t * nv + hh] = -g.a_log_exp[hh] * softplus(a[hh] + g.dt_bias[hh]);
            }
        }

        // The delta rule per value head, heads in parallel.
        let gather = |src: &[f32], d: usize, heads: usize, hh: usize| -> Vec<f32> {
            src.chunks_exact(heads * d)
                .flat_map(|row| &row[hh * d..(hh + 1) * d])
                .copied()
                .collect()
        };
        let results: Vec<(Vec<f32>, Vec<f32>)> = (0..nv)
            .into_par_iter()
            .with_min_len(if n * dk * dv < 1 << 14 { nv } else { 1 })
            .map(|hh| {
                let kh = c.key_head(hh);
                let (qh, khd, vh) = (
                    gather(&q, dk, c.n_k_heads, kh),
                    gather(&k, dk, c.n_k_heads, kh),
                    gather(&v, dv, nv, hh),
                );
                let gh: Vec<f32> = (0..n).map(|t| decay[t * nv + hh]).collect();
                let bh: Vec<f32> = (0..n).map(|t| beta[t * nv + hh]).collect();
                let inputs = HeadInputs {
                    q: &qh,
                    k: &khd,
                    v: &vh,
                    g: &gh,
                    beta: &bh,
                    dk,
                    dv,
                };
                let mut s = rec_state[hh * dk * dv..(hh + 1) * dk * dv].to_vec();
                let o = if n >= MIN_CHUNKED {
                    delta_rule_chunked(&inputs, &mut s)
                } else {
                    delta_rule_sequential(&inputs, &mut s)
                };
                (o, s)
            })
            .collect();
        let mut core = vec![0.0f32; n * vd];
        let mut new_state = Vec::with_capacity(nv * dk * dv);
        for (hh, (o, s)) in results.into_iter().enumerate() {
            for (t, row) in o.chunks_exact(dv).enumerate() {
                core[t * vd + hh * dv..t * vd + (hh + 1) * dv].copy_from_slice(row);
            }
            new_state.extend_from_slice(&s);
        }
        state.set_recurrent(layer, new_conv, new_state);

        // Gated RMSNorm per head: w ⊙ norm(o) ⊙ silu(z).
        g.norm.forward_inplace(&mut core);
        let mut z: Vec<f32> = proj
            .chunks_exact(width)
            .flat_map(|row| &row[conv_dim..conv_dim + vd])
            .copied()
            .collect();
        silu(&mut z);
        for (o, zz) in core.iter_mut().zip(&z) {
            *o *= zz;
        }
        g.out_proj.forward(&core)
    }

    /// A gated full-attention layer over the `n` new tokens of one sequence.
    fn attention(
        &self,
        layer: usize,
        a: &GatedAttention,
        x: &[f32],
        positions: &[usize],
        state: &mut SeqState,
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        let (hd, q_dim, kv_dim) = (cfg.head_dim, cfg.q_dim(), cfg.kv_dim());
        let qg = a.q_proj.forward(x);
        let kv = a.kv_proj.forward(x);
        let n = positions.len();
        let mut q = Vec::with_capacity(n * q_dim);
        let mut gate = Vec::with_capacity(n * q_dim);
        for head in qg.chunks_exact(2 * hd) {
            q.extend_from_slice(&head[..hd]);
            gate.extend_from_slice(&head[hd..]);
        }
        let mut k = Vec::with_capacity(n * kv_dim);
        let mut v = Vec::with_capacity(n * kv_dim);
        for row in kv.chunks_exact(2 * kv_dim) {
            k.extend_from_slice(&row[..kv_dim]);
            v.extend_from_slice(&row[kv_dim..]);
        }
        a.q_norm.forward_inplace(&mut q);
        a.k_norm.forward_inplace(&mut k);
        self.rope.apply(&mut q, cfg.n_heads, positions);
        self.rope.apply(&mut k, cfg.n_kv_heads, positions);
        state.append(layer, &k, &v);
        let shape = CausalShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            sliding_window: None,
        };
        let mut ctx = cached_attention(&q, state, layer, &shape, 1.0 / (hd as f32).sqrt())?;
        for (c, &gt) in ctx.iter_mut().zip(&gate) {
            *c *= 1.0 / (1.0 + (-gt).exp());
        }
        Ok(a.o_proj.forward(&ctx))
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
        ids: &[u32],
        lens: &[usize],
        caches: &mut [&mut SeqState],
        outputs: Outputs,
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        batch_positions(ids, lens, caches, cfg.kv_dim())?;
        let h = cfg.hidden_size;
        let mut x = embed_tokens(&self.embed, ids, h)?;
        for (layer, b) in self.blocks.iter().enumerate() {
            let mut hn = x.clone();
            b.input_norm.forward_inplace(&mut hn);
            let mut mixed = Vec::with_capacity(x.len());
            let mut row0 = 0;
            for (&len, cache) in lens.iter().zip(caches.iter_mut()) {
                let rows = &hn[row0 * h..(row0 + len) * h];
                let out = match &b.mixer {
                    Mixer::Linear(g) => self.gdn(layer, g, rows, cache),
                    Mixer::Full(a) => {
                        let positions: Vec<usize> = (cache.len()..cache.len() + len).collect();
                        self.attention(layer, a, rows, &positions, cache)?
                    }
                };
                mixed.extend(out);
                row0 += len;
            }
            for (xv, m) in x.iter_mut().zip(&mixed) {
                *xv += m;
            }
            let mut hn = x.clone();
            b.post_norm.forward_inplace(&mut hn);
            let act = silu_mul(&b.gate_up.forward(&hn), cfg.intermediate_size);
            x = b.down.forward_residual(&act, &x);
        }
        finish_batch(x, lens, caches, outputs, &self.norm, Some(&self.lm_head))
    }
}
