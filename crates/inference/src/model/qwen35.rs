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

use crate::attention::gdn::{delta_rule_heads, log_decay, GdnInputs};
use crate::attention::{attend, CausalShape};
use crate::backend::Op;
use crate::ops::{
    causal_conv1d, l2_normalize_rows, scale, sigmoid, sigmoid_gate, silu, silu_gate, silu_mul,
    split_columns, Linear, RmsNorm, Rope,
};
use crate::state::{LayerKind, SeqState};
use crate::{Error, Result};

use super::batch::ForwardBatch;
use super::decoder::{embed_rows, finish_batch, Decoder, DecoderConfig, DecoderInfo};
use super::hybrid::GdnConfig;
use super::source::{EmbeddingTable, Placement, TensorSource};

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
    Linear(Box<Gdn>),
    Full(Box<GatedAttention>),
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
    /// Loads the text model described by `cfg` (with its hybrid settings) from `src`.
    pub fn load(cfg: DecoderConfig, src: &TensorSource, place: &Placement) -> Result<Self> {
        place
            .device
            .require(&[Op::GatedDeltaNet], "Qwen3.5 (hybrid)")?;
        let mode = place.mode;
        let hybrid = cfg.hybrid.clone().ok_or_else(|| {
            Error::UnsupportedModel("a Qwen3.5 configuration without its hybrid settings".into())
        })?;
        let (gdn, full) = (hybrid.gdn, hybrid.full_attention);
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
                Mixer::Full(Box::new(GatedAttention {
                    q_proj: src.linear(&[&q], &[2 * q_dim], h, bias, place, &[])?,
                    kv_proj: src.linear(&[&k, &v], &[kv_dim, kv_dim], h, bias, place, &[])?,
                    q_norm: offset_norm(src, &format!("{a}.q_norm"), hd, eps)?,
                    k_norm: offset_norm(src, &format!("{a}.k_norm"), hd, eps)?,
                    o_proj: src.linear(&[&o], &[h], q_dim, cfg.o_bias, place, &[])?,
                }))
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
                Mixer::Linear(Box::new(Gdn {
                    in_proj: src.linear(&refs, &[conv_dim, vd, nv, nv], h, false, place, &[])?,
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
                        place,
                        &[],
                    )?,
                }))
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
                    place,
                    &[],
                )?,
                down: src.linear(
                    &[&format!("{mlp}.down_proj")],
                    &[h],
                    inter,
                    false,
                    place,
                    &[],
                )?,
            });
        }
        let norm = offset_norm(src, "model.norm", h, eps)?;
        let lm_head = if cfg.tie_word_embeddings && !src.contains("lm_head", "weight") {
            embed.to_linear(place)?
        } else {
            src.linear(&["lm_head"], &[cfg.vocab_size], h, false, place, &[])?
        };
        let rope = match &cfg.mrope {
            Some(m) => Rope::new(&cfg.rope, hd)?.with_mrope(m)?,
            None => Rope::new(&cfg.rope, hd)?,
        };
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
                device: place.device.clone(),
                weight_bytes,
                instance: super::decoder::next_instance(),
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
        positions: (&[usize], Option<&[[usize; 3]]>),
        caches: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        let cfg = self.config();
        let (hd, kv_dim) = (cfg.head_dim, cfg.kv_dim());
        // q_proj holds a query and a gate per head.
        let [mut q, gate] = split_columns(&a.q_proj.forward(hn), [hd, hd]);
        let [mut k, v] = split_columns(&a.kv_proj.forward(hn), [kv_dim, kv_dim]);
        a.q_norm.forward_inplace(&mut q);
        a.k_norm.forward_inplace(&mut k);
        let (p1, p3) = positions;
        self.rope.apply_rows(&mut q, cfg.n_heads, p1, p3)?;
        self.rope.apply_rows(&mut k, cfg.n_kv_heads, p1, p3)?;
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
        let positions = batch.validate(caches, cfg.kv_dim(), cfg.hidden_size, self.rope.is_3d())?;
        let p3 = batch.rope3d();
        let lens = &batch.seq_lens;
        let mut x = embed_rows(&self.embed, batch, cfg.hidden_size)?;
        for (layer, l) in self.layers.iter().enumerate() {
            let mut hn = x.clone();
            l.input_norm.forward_inplace(&mut hn);
            x = match &l.mixer {
                Mixer::Linear(g) => self.gdn(layer, g, &hn, &x, lens, caches),
                Mixer::Full(a) => {
                    self.attention(layer, a, &hn, &x, lens, (&positions, p3), caches)?
                }
            };
            let mut hn = x.clone();
            l.post_norm.forward_inplace(&mut hn);
            let act = silu_mul(&l.gate_up.forward(&hn), cfg.intermediate_size);
            x = l.down.forward_residual(&act, &x);
        }
        finish_batch(x, batch, caches, &self.norm, Some(&self.lm_head))
    }
}
