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
//! Written as calls to `ops` and `attention` over [`Tensor`]s, so the same code runs on every
//! device. A pass runs every projection over the packed rows of all sequences at once; the
//! convolution and delta rule run over each sequence's recurrent state ([`GdnLayer`]) and the
//! attention over each sequence's cache.

use crate::attention::{attend_qkv, CausalShape, GdnLayer, QkvHeads};
use crate::backend::{Device, Op};
use crate::metrics::observe_layer;
use crate::ops::{pick_rows, sigmoid_gate, split_query_gate, Linear, RmsNorm, Rope};
use crate::sample::{Pick, Picked};
use crate::state::{LayerKind, SeqState};
use crate::tensor::Tensor;
use crate::{Error, Result};

use super::batch::ForwardBatch;
use super::decoder::{embed_tensor, finish_tensor, Decoder, DecoderConfig, DecoderInfo};
use super::source::{EmbeddingTable, Placement, TensorSource};

#[derive(Debug)]
struct Gdn {
    in_proj: Linear, // [conv_dim + value_dim + 2 n_v_heads, hidden]: qkv, z, b, a
    core: GdnLayer,
    norm: RmsNorm, // [v_dim], plain weight
    out_proj: Linear,
}

#[derive(Debug)]
struct GatedAttention {
    qkv_proj: Linear, // [2 q_dim + 2 kv_dim]: per head a query then a gate; keys; values
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
                    qkv_proj: src.linear(
                        &[&q, &k, &v],
                        &[2 * q_dim, kv_dim, kv_dim],
                        h,
                        bias,
                        place,
                        &[],
                    )?,
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
                    core: GdnLayer::new(
                        *heads,
                        gdn.conv_kernel,
                        src.conv_kernel(&format!("{a}.conv1d"), conv_dim, gdn.conv_kernel)?,
                        src.a_log_exp(&a, nv)?,
                        src.f32(&a, "dt_bias", &[nv])?.as_slice().to_vec(),
                    )?,
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
                    Mixer::Full(a) => a.qkv_proj.weight_bytes() + a.o_proj.weight_bytes(),
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

    fn device(&self) -> &Device {
        &self.info.device
    }

    /// A gated full-attention layer's mixer over the packed new tokens of every sequence (`x`
    /// the residual stream, at `positions`); returns `x` plus its output.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: usize,
        a: &GatedAttention,
        norm: &RmsNorm,
        x: Tensor,
        lens: &[usize],
        positions: (&[usize], Option<&[[usize; 3]]>),
        states: &mut [&mut SeqState],
    ) -> Result<Tensor> {
        let cfg = self.config();
        let hd = cfg.head_dim;
        // Per head a query and its gate, then keys and values.
        let proj = a.qkv_proj.apply_normed(&x, norm)?;
        let (qkv, gate) = split_query_gate(&proj, cfg.n_heads, hd)?;
        let heads = QkvHeads {
            norms: Some((&a.q_norm, &a.k_norm)),
            rope: &self.rope,
            positions: positions.0,
            positions_3d: positions.1,
        };
        let shape = CausalShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            sliding_window: None,
        };
        let scale = 1.0 / (hd as f32).sqrt();
        let mut ctx = attend_qkv(&qkv, &heads, lens, states, layer, &shape, scale)?;
        sigmoid_gate(&mut ctx, &gate)?;
        a.o_proj.apply_residual(&ctx, x)
    }

    /// The pass: what `batch.outputs` asks for, on the model's device.
    fn run(&self, batch: &ForwardBatch<'_>, states: &mut [&mut SeqState]) -> Result<Tensor> {
        let cfg = self.config();
        let positions = batch.validate(states, cfg.kv_dim(), cfg.hidden_size, self.rope.is_3d())?;
        let p3 = batch.rope3d();
        let lens = &batch.seq_lens;
        let mut x = embed_tensor(&self.embed, batch, cfg.hidden_size, self.device())?;
        for (layer, l) in self.layers.iter().enumerate() {
            x = observe_layer(layer, x, |x| {
                let x = match &l.mixer {
                    Mixer::Linear(g) => {
                        let proj = g.in_proj.apply_normed(&x, &l.input_norm)?;
                        let mut core = g.core.apply(layer, &proj, lens, states)?;
                        g.core.gated_norm(&mut core, &proj, &g.norm)?;
                        g.out_proj.apply_residual(&core, x)?
                    }
                    Mixer::Full(a) => {
                        self.attention(layer, a, &l.input_norm, x, lens, (&positions, p3), states)?
                    }
                };
                let gate_up = l.gate_up.apply_normed(&x, &l.post_norm)?;
                l.down.apply_swiglu_residual(&gate_up, x)
            })?;
        }
        finish_tensor(x, batch, states, &self.norm, Some(&self.lm_head))
    }
}

impl Decoder for Qwen35Model {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn new_cache(&self, max_len: usize) -> SeqState {
        let cfg = self.config();
        SeqState::with_layers_on(
            self.device(),
            &self.kinds,
            cfg.kv_dim(),
            max_len.min(cfg.max_positions),
        )
    }

    fn forward_on_pool(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        self.run(batch, states)?.into_host()
    }

    fn pick_on_pool(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
        picks: &[Pick],
    ) -> Result<Vec<Picked>> {
        pick_rows(&self.run(batch, states)?, picks)
    }
}
