//! The Llama layer structure, shared by Llama / Mistral / SmolLM, Qwen2 and Qwen3 (also the
//! Qwen3-Embedding encoder): pre-norm RMSNorm layers, grouped-query causal attention with RoPE
//! (Qwen2: Q/K/V biases; Qwen3: per-head Q/K RMSNorm before RoPE), a SwiGLU MLP, a final RMSNorm
//! and an output head that may reuse the embedding table.
//!
//! Written as calls to `ops` and `attention` over [`Tensor`]s, so the same code runs on every
//! device; the weights come from a [`TensorSource`] by their transformers names, so
//! safetensors checkpoints and GGUF files load through the same code.

use crate::attention::{attend_qkv, CausalShape, QkvHeads};
use crate::backend::{Device, Op};
use crate::metrics::observe_layer;
use crate::ops::{pick_rows, Linear, RmsNorm, Rope};
use crate::sample::{Pick, Picked};
use crate::state::{LayerKind, SeqState};
use crate::tensor::Tensor;
use crate::Result;

use super::batch::ForwardBatch;
use super::decoder::{embed_tensor, finish_tensor, Decoder, DecoderConfig, DecoderInfo, Outputs};
use super::source::{EmbeddingTable, Placement, TensorSource};
use super::{Encoder, EncoderInfo, PackedBatch};

/// One transformer layer.
#[derive(Debug)]
struct Layer {
    attn_norm: RmsNorm,
    qkv: Linear, // [q_dim + 2 kv_dim, hidden]
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o_proj: Linear,
    mlp_norm: RmsNorm,
    gate_up: Linear, // [2 intermediate, hidden]
    down: Linear,
}

/// A Llama-family decoder.
#[derive(Debug)]
pub struct LlamaModel {
    info: DecoderInfo,
    embed: EmbeddingTable,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Option<Linear>, // None when loaded as an encoder
    rope: Rope,
    encoder_info: EncoderInfo,
}

impl LlamaModel {
    /// Loads the weights described by `cfg` from `src`; without `with_head` the output head is
    /// left out (the model then only serves hidden states, e.g. as an embedding encoder).
    pub fn load(
        cfg: DecoderConfig,
        src: &TensorSource,
        place: &Placement,
        with_head: bool,
    ) -> Result<Self> {
        place.device.require(
            &[Op::RmsNorm, Op::Rope, Op::SiluMul, Op::AttentionF32],
            &format!("a {} decoder", cfg.model_type),
        )?;
        let mode = place.mode;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        let (q_dim, kv_dim, inter) = (cfg.q_dim(), cfg.kv_dim(), cfg.intermediate_size);
        let embed = src.embedding("model.embed_tokens", cfg.vocab_size, h, mode)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            let (q, k, v, o) = (
                format!("{attn}.q_proj"),
                format!("{attn}.k_proj"),
                format!("{attn}.v_proj"),
                format!("{attn}.o_proj"),
            );
            let head_norm = |name: &str| -> Result<Option<RmsNorm>> {
                cfg.qk_norm
                    .then(|| {
                        Ok(RmsNorm::new(
                            src.f32(&format!("{attn}.{name}"), "weight", &[hd])?,
                            cfg.rms_norm_eps,
                        ))
                    })
                    .transpose()
            };
            let norm = |name: &str| -> Result<RmsNorm> {
                Ok(RmsNorm::new(
                    src.f32(&format!("{p}.{name}"), "weight", &[h])?,
                    cfg.rms_norm_eps,
                ))
            };
            let mlp = format!("{p}.mlp");
            layers.push(Layer {
                attn_norm: norm("input_layernorm")?,
                qkv: src.linear(
                    &[&q, &k, &v],
                    &[q_dim, kv_dim, kv_dim],
                    h,
                    cfg.qkv_bias,
                    place,
                    &[Some(cfg.n_heads), Some(cfg.n_kv_heads), None],
                )?,
                q_norm: head_norm("q_norm")?,
                k_norm: head_norm("k_norm")?,
                o_proj: src.linear(&[&o], &[h], q_dim, cfg.o_bias, place, &[])?,
                mlp_norm: norm("post_attention_layernorm")?,
                gate_up: src.linear(
                    &[&format!("{mlp}.gate_proj"), &format!("{mlp}.up_proj")],
                    &[inter, inter],
                    h,
                    cfg.mlp_bias,
                    place,
                    &[],
                )?,
                down: src.linear(
                    &[&format!("{mlp}.down_proj")],
                    &[h],
                    inter,
                    cfg.mlp_bias,
                    place,
                    &[],
                )?,
            });
        }
        let norm = RmsNorm::new(src.f32("model.norm", "weight", &[h])?, cfg.rms_norm_eps);
        let lm_head = if !with_head {
            None
        } else if cfg.tie_word_embeddings && !src.contains("lm_head", "weight") {
            Some(embed.to_linear(place)?)
        } else {
            Some(src.linear(&["lm_head"], &[cfg.vocab_size], h, false, place, &[])?)
        };
        let rope = match &cfg.mrope {
            Some(m) => Rope::new(&cfg.rope, hd)?.with_mrope(m)?,
            None => Rope::new(&cfg.rope, hd)?,
        };
        let weight_bytes = layers
            .iter()
            .map(|l| {
                l.qkv.weight_bytes()
                    + l.o_proj.weight_bytes()
                    + l.gate_up.weight_bytes()
                    + l.down.weight_bytes()
            })
            .sum::<usize>()
            + lm_head.as_ref().map_or(0, Linear::weight_bytes);
        let encoder_info = EncoderInfo {
            model_type: cfg.model_type.clone(),
            hidden_size: cfg.hidden_size,
            max_positions: cfg.max_positions,
            n_layers: cfg.n_layers,
            intermediate_size: cfg.intermediate_size,
        };
        Ok(Self {
            info: DecoderInfo {
                config: cfg,
                weight_mode: mode,
                weight_bytes,
                device: place.device.clone(),
                instance: super::decoder::next_instance(),
            },
            embed,
            layers,
            norm,
            lm_head,
            rope,
            encoder_info,
        })
    }

    fn config(&self) -> &DecoderConfig {
        &self.info.config
    }

    /// One layer over the packed new tokens of every sequence (`x` [rows, hidden]).
    fn forward_layer(
        &self,
        layer: usize,
        x: Tensor,
        lens: &[usize],
        positions: (&[usize], Option<&[[usize; 3]]>),
        caches: &mut [&mut SeqState],
    ) -> Result<Tensor> {
        let cfg = self.config();
        let l = &self.layers[layer];
        let qkv = l.qkv.apply_normed(&x, &l.attn_norm)?;
        let heads = QkvHeads {
            norms: l.q_norm.as_ref().zip(l.k_norm.as_ref()),
            rope: &self.rope,
            positions: positions.0,
            positions_3d: positions.1,
        };
        let shape = CausalShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            sliding_window: cfg.sliding_window,
        };
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let ctx = attend_qkv(&qkv, &heads, lens, caches, layer, &shape, scale)?;
        let x = l.o_proj.apply_residual(&ctx, x)?;
        self.mlp(l, x)
    }

    /// The feed-forward half of a layer, with its residual.
    fn mlp(&self, l: &Layer, x: Tensor) -> Result<Tensor> {
        let gate_up = l.gate_up.apply_normed(&x, &l.mlp_norm)?;
        l.down.apply_swiglu_residual(&gate_up, x)
    }

    fn device(&self) -> &Device {
        &self.info.device
    }
}

impl Decoder for LlamaModel {
    fn info(&self) -> &DecoderInfo {
        &self.info
    }

    fn new_cache(&self, max_len: usize) -> SeqState {
        let cfg = self.config();
        let kinds = vec![LayerKind::Attention; cfg.n_layers];
        SeqState::with_layers_on(
            self.device(),
            &kinds,
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

impl LlamaModel {
    /// The pass: what `batch.outputs` asks for, on the model's device.
    fn run(&self, batch: &ForwardBatch<'_>, states: &mut [&mut SeqState]) -> Result<Tensor> {
        let cfg = self.config();
        let positions = batch.validate(states, cfg.kv_dim(), cfg.hidden_size, self.rope.is_3d())?;
        let p3 = batch.rope3d();
        let mut x = embed_tensor(&self.embed, batch, cfg.hidden_size, self.device())?;
        for layer in 0..self.layers.len() {
            x = observe_layer(layer, x, |x| {
                self.forward_layer(layer, x, &batch.seq_lens, (&positions, p3), states)
            })?;
            batch.add_deepstack(layer, &mut x)?;
        }
        finish_tensor(x, batch, states, &self.norm, self.lm_head.as_ref())
    }
}

/// As an embedding encoder (Qwen3-Embedding): causal attention within each sequence, the
/// final-norm hidden state of every token.
impl Encoder for LlamaModel {
    fn info(&self) -> &EncoderInfo {
        &self.encoder_info
    }

    fn forward_on_pool(&self, batch: &PackedBatch) -> Result<Vec<f32>> {
        batch.validate(self.config().max_positions)?;
        let lens: Vec<usize> = batch.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect();
        let mut caches: Vec<SeqState> = lens.iter().map(|&l| self.new_cache(l)).collect();
        let mut refs: Vec<&mut SeqState> = caches.iter_mut().collect();
        Decoder::forward(self, &batch.ids, &lens, &mut refs, Outputs::AllHidden)
    }
}
