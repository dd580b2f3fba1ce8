//! BitNet b1.58 (transformers' `BitNetForCausalLM`, microsoft/bitnet-b1.58-2B-4T): the Llama
//! layer structure with every projection a `BitLinear` (ternary weights with one scale per
//! matrix, int8 activations quantized per token), an RMSNorm over the attention output before
//! `o_proj` (`attn_sub_norm`) and over the gated activations before `down_proj`
//! (`ffn_sub_norm`), and a squared-ReLU GLU (SiLU in llama.cpp's `bitnet` GGUF graph). The
//! embedding table and the output head stay in full precision.
//!
//! Weights come from a transformers checkpoint whose `quantization_config` says how they are
//! held (see [`BitLinearKind`]) or from a GGUF file (TQ1_0, TQ2_0, bitnet.cpp's I2_S, or float
//! tensors holding ternary values). Runs on the CPU.

use crate::attention::{attend_qkv, CausalShape, QkvHeads};
use crate::backend::{Device, Op};
use crate::metrics::observe_layer;
use crate::ops::{pick_rows, relu2_glu, swiglu, Linear, RmsNorm, Rope};
use crate::sample::{Pick, Picked};
use crate::state::{LayerKind, SeqState};
use crate::tensor::Tensor;
use crate::{Error, Result};

use super::batch::ForwardBatch;
use super::decoder::{
    embed_tensor, finish_tensor, Decoder, DecoderConfig, DecoderInfo, MlpActivation,
};
use super::source::{BitLinearKind, EmbeddingTable, Placement, TensorSource};

/// One transformer layer.
#[derive(Debug)]
struct Layer {
    attn_norm: RmsNorm,
    qkv: Linear, // ternary [q_dim + 2 kv_dim, hidden]
    attn_sub_norm: RmsNorm,
    o_proj: Linear,
    mlp_norm: RmsNorm,
    gate_up: Linear, // ternary [2 intermediate, hidden]
    ffn_sub_norm: RmsNorm,
    down: Linear,
}

/// A BitNet b1.58 decoder.
#[derive(Debug)]
pub struct BitNetModel {
    info: DecoderInfo,
    embed: EmbeddingTable,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
}

/// How `src` holds its ternary layers: GGUF files by their tensor types, transformers
/// checkpoints by `quantization_config` (a checkpoint without one has plain full-precision
/// linear layers in transformers, which is not a BitNet model and is refused).
fn bitlinear_kind(src: &TensorSource) -> Result<BitLinearKind> {
    let Some(cfg) = src.hf_config() else {
        return Ok(BitLinearKind::Gguf);
    };
    let q = cfg.get("quantization_config").filter(|q| q.is_object());
    let field = |k: &str| q.and_then(|q| q.get(k)).and_then(|v| v.as_str());
    let unsupported = |what: String| Error::UnsupportedModel(format!("BitNet checkpoint: {what}"));
    match q {
        None => {
            return Err(unsupported(
                "no `quantization_config` (transformers then runs full-precision linear layers; \
                 a BitNet checkpoint says `quant_method: bitnet`)"
                    .into(),
            ))
        }
        Some(_) if field("quant_method") != Some("bitnet") => {
            return Err(unsupported(format!(
                "quant_method {:?} (want \"bitnet\")",
                field("quant_method")
            )))
        }
        Some(q) if q.get("use_rms_norm").and_then(|v| v.as_bool()) == Some(true) => {
            return Err(unsupported(
                "`use_rms_norm: true` (an RMSNorm inside every BitLinear) is not supported".into(),
            ))
        }
        Some(q)
            if q.get("modules_to_not_convert")
                .is_some_and(|v| !v.is_null()) =>
        {
            return Err(unsupported(
                "`modules_to_not_convert` is not supported (every projection is ternary here)"
                    .into(),
            ))
        }
        Some(_) => {}
    }
    match (
        field("linear_class").unwrap_or("bitlinear"),
        field("quantization_mode").unwrap_or("offline"),
    ) {
        ("bitlinear", "offline") => Ok(BitLinearKind::Packed),
        ("autobitlinear", "offline") => Ok(BitLinearKind::PackedAuto),
        ("autobitlinear", "online") => Ok(BitLinearKind::Online),
        (class, mode) => Err(unsupported(format!(
            "linear_class `{class}` with quantization_mode `{mode}` (transformers accepts \
             bitlinear/offline and autobitlinear/offline|online)"
        ))),
    }
}

impl BitNetModel {
    /// Loads the weights described by `cfg` from `src`.
    pub fn load(cfg: DecoderConfig, src: &TensorSource, place: &Placement) -> Result<Self> {
        if !place.device.is_cpu() {
            return Err(Error::Device(format!(
                "BitNet's ternary products run on the CPU only; {} is not supported for this \
                 model yet",
                place.device
            )));
        }
        place.device.require(
            &[Op::RmsNorm, Op::Rope, Op::AttentionF32],
            &format!("a {} decoder", cfg.model_type),
        )?;
        let held = bitlinear_kind(src)?;
        let (h, q_dim, kv_dim, inter) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        if q_dim != h {
            return Err(Error::UnsupportedModel(format!(
                "BitNet: heads × head_dim = {q_dim} must equal hidden_size {h} (attn_sub_norm \
                 normalizes the attention output over hidden_size)"
            )));
        }
        if cfg.qkv_bias || cfg.o_bias || cfg.mlp_bias {
            return Err(Error::UnsupportedModel(
                "BitNet with biases on its projections is not supported".into(),
            ));
        }
        let eps = cfg.rms_norm_eps;
        let norm = |p: &str, dim: usize| -> Result<RmsNorm> {
            Ok(RmsNorm::new(src.f32(p, "weight", &[dim])?, eps))
        };
        let embed = src.embedding("model.embed_tokens", cfg.vocab_size, h, place.mode)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = format!("model.layers.{i}");
            let (attn, mlp) = (format!("{p}.self_attn"), format!("{p}.mlp"));
            let proj = |names: &[String], dims: &[usize], in_dim: usize| -> Result<Linear> {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                src.ternary_linear(&names, dims, in_dim, held)
            };
            layers.push(Layer {
                attn_norm: norm(&format!("{p}.input_layernorm"), h)?,
                qkv: proj(
                    &[
                        format!("{attn}.q_proj"),
                        format!("{attn}.k_proj"),
                        format!("{attn}.v_proj"),
                    ],
                    &[q_dim, kv_dim, kv_dim],
                    h,
                )?,
                attn_sub_norm: norm(&format!("{attn}.attn_sub_norm"), h)?,
                o_proj: proj(&[format!("{attn}.o_proj")], &[h], q_dim)?,
                mlp_norm: norm(&format!("{p}.post_attention_layernorm"), h)?,
                gate_up: proj(
                    &[format!("{mlp}.gate_proj"), format!("{mlp}.up_proj")],
                    &[inter, inter],
                    h,
                )?,
                ffn_sub_norm: norm(&format!("{mlp}.ffn_sub_norm"), inter)?,
                down: proj(&[format!("{mlp}.down_proj")], &[h], inter)?,
            });
        }
        let norm = norm("model.norm", h)?;
        let lm_head = if cfg.tie_word_embeddings && !src.contains("lm_head", "weight") {
            embed.to_linear(place)?
        } else {
            src.linear(&["lm_head"], &[cfg.vocab_size], h, false, place, &[])?
        };
        let rope = Rope::new(&cfg.rope, cfg.head_dim)?;
        let weight_bytes = layers
            .iter()
            .map(|l| {
                l.qkv.weight_bytes()
                    + l.o_proj.weight_bytes()
                    + l.gate_up.weight_bytes()
                    + l.down.weight_bytes()
            })
            .sum::<usize>()
            + lm_head.weight_bytes();
        Ok(Self {
            info: DecoderInfo {
                config: cfg,
                weight_mode: place.mode,
                weight_bytes,
                device: place.device.clone(),
                instance: super::decoder::next_instance(),
            },
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

    /// One layer over the packed new tokens of every sequence (`x` [rows, hidden]).
    fn forward_layer(
        &self,
        layer: usize,
        x: Tensor,
        lens: &[usize],
        positions: &[usize],
        caches: &mut [&mut SeqState],
    ) -> Result<Tensor> {
        let cfg = self.config();
        let l = &self.layers[layer];
        let qkv = l.qkv.apply(&l.attn_norm.norm(&x)?)?;
        let heads = QkvHeads {
            norms: None,
            rope: &self.rope,
            positions,
            positions_3d: None,
        };
        let shape = CausalShape {
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            sliding_window: cfg.sliding_window,
        };
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let ctx = attend_qkv(&qkv, &heads, lens, caches, layer, &shape, scale)?;
        let x = l.o_proj.apply_residual(&l.attn_sub_norm.norm(&ctx)?, x)?;
        let gate_up = l.gate_up.apply(&l.mlp_norm.norm(&x)?)?;
        let act = match cfg.mlp_act {
            MlpActivation::Relu2 => relu2_glu(&gate_up)?,
            MlpActivation::Silu => swiglu(&gate_up)?,
        };
        l.down.apply_residual(&l.ffn_sub_norm.norm(&act)?, x)
    }

    /// The pass: what `batch.outputs` asks for.
    fn run(&self, batch: &ForwardBatch<'_>, states: &mut [&mut SeqState]) -> Result<Tensor> {
        let cfg = self.config();
        let positions = batch.validate(states, cfg.kv_dim(), cfg.hidden_size, false)?;
        let mut x = embed_tensor(&self.embed, batch, cfg.hidden_size, &self.info.device)?;
        for layer in 0..self.layers.len() {
            x = observe_layer(layer, x, |x| {
                self.forward_layer(layer, x, &batch.seq_lens, &positions, states)
            })?;
        }
        finish_tensor(x, batch, states, &self.norm, Some(&self.lm_head))
    }

    fn device(&self) -> &Device {
        &self.info.device
    }
}

impl Decoder for BitNetModel {
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
