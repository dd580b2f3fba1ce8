//! What every decoder (causal language model) shares: its validated configuration
//! ([`DecoderConfig`], read from a transformers `config.json` or from GGUF metadata), the
//! [`Decoder`] trait the generation loop drives. [`load_decoder`] (the registry in
//! [`crate::model`]) picks the architecture from a model directory or a `.gguf` file.

use std::path::Path;

use serde_json::Value;

use crate::backend::Device;
use crate::io::gguf::GgufFile;
use crate::ops::{Linear, Mrope, RmsNorm, RopeConfig, RopeScaling};
use crate::sample::{Pick, Picked};
use crate::state::SeqState;
use crate::{Error, Result};

use super::batch::{BatchInput, ForwardBatch, RowOutputs};
use super::hybrid::HybridConfig;
use super::source::{EmbeddingTable, WeightMode};
use crate::tensor::Tensor;

/// Decoder architectures that share the Llama layer structure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderArch {
    /// Llama (also Mistral and SmolLM): optional biases everywhere via `attention_bias`.
    Llama,
    /// Qwen2: biases on the Q, K, V projections.
    Qwen2,
    /// Qwen3: RMSNorm on each query and key head before RoPE.
    Qwen3,
    /// Qwen3.5: Gated DeltaNet layers between gated full-attention layers (`model::qwen35`).
    Qwen35,
    /// BitNet b1.58: ternary projections on int8 activations, sub-norms before the attention
    /// output and the down projection (`model::bitnet`).
    BitNet,
}

/// The gated MLP's activation: `act(gate) ⊙ up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    /// SiLU (SwiGLU), the Llama family's.
    Silu,
    /// Squared ReLU (`relu2`), BitNet b1.58's.
    Relu2,
}

/// A decoder's hyper-parameters, checked for consistency.
#[derive(Debug, Clone)]
pub struct DecoderConfig {
    /// Architecture family.
    pub arch: DecoderArch,
    /// `model_type` (config.json) or `general.architecture` (GGUF).
    pub model_type: String,
    /// Rows of the embedding table and of the output head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU layer.
    pub intermediate_size: usize,
    /// Transformer layers.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_heads`).
    pub n_kv_heads: usize,
    /// Features per head (`n_heads * head_dim` may differ from `hidden_size`).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// Rotary embedding.
    pub rope: RopeConfig,
    /// Longest context the model supports.
    pub max_positions: usize,
    /// Whether the output head reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Biases on the Q, K, V projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Biases on the MLP projections.
    pub mlp_bias: bool,
    /// Per-head RMSNorm of queries and keys (Qwen3).
    pub qk_norm: bool,
    /// Sliding attention window, when the model uses one.
    pub sliding_window: Option<usize>,
    /// Beginning-of-sequence token, if any.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Hybrid models (Qwen3.5): the linear-attention settings and layer kinds.
    pub hybrid: Option<HybridConfig>,
    /// Multimodal rotary embeddings (`mrope_section`): the model takes 3-D positions.
    pub mrope: Option<Mrope>,
    /// The gated MLP's activation.
    pub mlp_act: MlpActivation,
}

impl DecoderConfig {
    /// Width of a layer's key (or value) rows.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of a layer's query rows.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Parses a transformers `config.json` (`path` only names the file in errors). Multimodal
    /// configs (Qwen3.5) are read from their `text_config`.
    pub fn from_hf_json(top: &Value, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let v = top
            .get("text_config")
            .filter(|t| t.is_object())
            .unwrap_or(top);
        let model_type = v
            .get("model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("missing `model_type`".into()))?
            .to_string();
        let arch = super::decoder_arch(&model_type, false, path)?;
        let usize_of = |key: &str| -> Result<Option<usize>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer"))),
            }
        };
        let need = |key: &str| -> Result<usize> {
            usize_of(key)?.ok_or_else(|| bad(format!("missing `{key}`")))
        };
        let f32_of = |obj: &Value, key: &str| -> Result<Option<f32>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(|f| Some(f as f32))
                    .ok_or_else(|| bad(format!("`{key}` must be a number"))),
            }
        };
        let bool_of = |key: &str, default: bool| -> bool {
            v.get(key).and_then(Value::as_bool).unwrap_or(default)
        };
        let mlp_act = match (v.get("hidden_act").and_then(Value::as_str), arch) {
            (None, DecoderArch::BitNet) | (Some("relu2"), DecoderArch::BitNet) => {
                MlpActivation::Relu2
            }
            (None, _) | (Some("silu"), _) => MlpActivation::Silu,
            (Some(act), _) => {
                return Err(bad(format!(
                    "hidden_act `{act}` is not supported (decoders use `silu`; BitNet `relu2`)"
                )));
            }
        };
        let hidden_size = need("hidden_size")?;
        let n_heads = need("num_attention_heads")?;
        let n_kv_heads = usize_of("num_key_value_heads")?.unwrap_or(n_heads);
        let head_dim = match usize_of("head_dim")? {
            Some(d) => d,
            None => hidden_size.checked_div(n_heads).unwrap_or(0),
        };
        // transformers 5 writes `rope_parameters` (theta inside); older files `rope_theta` and
        // `rope_scaling`.
        let rope_params = v
            .get("rope_parameters")
            .filter(|x| x.is_object())
            .or_else(|| v.get("rope_scaling").filter(|x| x.is_object()));
        let theta = rope_params
            .map(|p| f32_of(p, "rope_theta"))
            .transpose()?
            .flatten()
            .or(f32_of(v, "rope_theta")?)
            .unwrap_or(10000.0);
        let partial = rope_params
            .map(|p| f32_of(p, "partial_rotary_factor"))
            .transpose()?
            .flatten()
            .or(f32_of(v, "partial_rotary_factor")?)
            .unwrap_or(1.0);
        let max_positions = need("max_position_embeddings")?;
        let scaling = match rope_params {
            None => RopeScaling::None,
            Some(p) => rope_scaling_from_json(p, max_positions).map_err(bad)?,
        };
        let sliding_window = match arch {
            DecoderArch::Llama => usize_of("sliding_window")?,
            _ if bool_of("use_sliding_window", false) => usize_of("sliding_window")?,
            _ => None,
        };
        let attention_bias = bool_of("attention_bias", false);
        let ids = |key: &str| -> Vec<u32> {
            match v.get(key) {
                Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
                Some(Value::Array(a)) => a
                    .iter()
                    .filter_map(Value::as_u64)
                    .map(|x| x as u32)
                    .collect(),
                _ => Vec::new(),
            }
        };
        let mut cfg = Self {
            arch,
            model_type,
            vocab_size: need("vocab_size")?,
            hidden_size,
            intermediate_size: need("intermediate_size")?,
            n_layers: need("num_hidden_layers")?,
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: f32_of(v, "rms_norm_eps")?.unwrap_or(1e-6),
            rope: RopeConfig {
                theta,
                rotary_dim: ((head_dim as f32 * partial) as usize) & !1,
                scaling,
            },
            max_positions,
            tie_word_embeddings: v
                .get("tie_word_embeddings")
                .or_else(|| top.get("tie_word_embeddings"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
            qkv_bias: arch == DecoderArch::Qwen2 || attention_bias,
            o_bias: arch != DecoderArch::Qwen2 && attention_bias,
            mlp_bias: arch == DecoderArch::Llama && bool_of("mlp_bias", false),
            qk_norm: matches!(arch, DecoderArch::Qwen3 | DecoderArch::Qwen35),
            sliding_window,
            bos_token_id: ids("bos_token_id").first().copied(),
            eos_token_ids: ids("eos_token_id"),
            hybrid: None,
            mlp_act,
            mrope: match rope_params.and_then(|p| p.get("mrope_section")) {
                None | Some(Value::Null) => None,
                Some(sec) => {
                    let section: Vec<usize> = sec
                        .as_array()
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_u64)
                                .map(|x| x as usize)
                                .collect()
                        })
                        .unwrap_or_default();
                    let section: [usize; 3] = section.try_into().map_err(|_| {
                        bad(format!(
                            "`mrope_section` must be 3 non-negative integers, not {sec}"
                        ))
                    })?;
                    // Qwen3-VL and Qwen3.5 interleave whatever the flag says; Qwen2-VL's
                    // contiguous sections are written with `mrope_interleaved: false`.
                    let interleaved = rope_params
                        .and_then(|p| p.get("mrope_interleaved"))
                        .and_then(Value::as_bool)
                        .unwrap_or(true);
                    Some(Mrope {
                        section,
                        interleaved,
                    })
                }
            },
        };
        if arch == DecoderArch::Qwen35 {
            cfg.hybrid = Some(HybridConfig::from_hf_json(top, cfg.n_layers).map_err(bad)?);
        }
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Reads the hyper-parameters from GGUF metadata (`{arch}.block_count`, ...).
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let path = file.path();
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let model_type = file
            .metadata("general.architecture")
            .and_then(|v| v.as_str())
            .ok_or_else(|| bad("missing `general.architecture`".into()))?
            .to_string();
        let arch = super::decoder_arch(&model_type, true, path)?;
        let key = |k: &str| format!("{model_type}.{k}");
        let get = |k: &str| -> Option<u64> { file.metadata(&key(k)).and_then(|v| v.as_u64()) };
        let need = |k: &str| -> Result<usize> {
            get(k)
                .map(|x| x as usize)
                .ok_or_else(|| bad(format!("missing `{}`", key(k))))
        };
        let float = |k: &str| file.metadata(&key(k)).and_then(|v| v.as_f64());
        let hidden_size = need("embedding_length")?;
        let n_heads = need("attention.head_count")?;
        let n_kv_heads = get("attention.head_count_kv").map_or(n_heads, |x| x as usize);
        let head_dim = get("attention.key_length")
            .map(|x| x as usize)
            .unwrap_or(hidden_size.checked_div(n_heads).unwrap_or(0));
        let rotary_dim = get("rope.dimension_count").map_or(head_dim, |x| x as usize);
        let vocab_size = match get("vocab_size") {
            Some(n) => n as usize,
            None => file
                .metadata("tokenizer.ggml.tokens")
                .and_then(|v| v.as_array())
                .map(|a| a.len())
                .ok_or_else(|| bad("no vocabulary size in the metadata".into()))?,
        };
        let scaling = match file
            .metadata(&key("rope.scaling.type"))
            .and_then(|v| v.as_str())
        {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: float("rope.scaling.factor").unwrap_or(1.0) as f32,
            },
            Some("yarn") => RopeScaling::Yarn {
                factor: float("rope.scaling.factor").unwrap_or(1.0) as f32,
                original_max_position_embeddings: need("rope.scaling.original_context_length")?,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: None,
                mscale_all_dim: None,
                truncate: true,
            },
            Some(other) => {
                return Err(bad(format!("rope scaling type `{other}` is not supported")));
            }
        };
        let id = |k: &str| file.metadata(k).and_then(|v| v.as_u64()).map(|x| x as u32);
        let mut cfg = Self {
            arch,
            model_type: model_type.clone(),
            vocab_size,
            hidden_size,
            intermediate_size: need("feed_forward_length")?,
            // `block_count` includes the multi-token-prediction layers llama.cpp's converter may
            // append (Qwen3.5); the decoder runs the others.
            n_layers: need("block_count")?
                .saturating_sub(get("nextn_predict_layers").unwrap_or(0) as usize),
            n_heads,
            n_kv_heads,
            head_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").unwrap_or(1e-6) as f32,
            rope: RopeConfig {
                theta: float("rope.freq_base").unwrap_or(10000.0) as f32,
                rotary_dim,
                scaling,
            },
            max_positions: need("context_length")?,
            tie_word_embeddings: false, // decided by the presence of `output.weight`
            qkv_bias: false,            // decided by the presence of the bias tensors
            o_bias: false,
            mlp_bias: false,
            qk_norm: matches!(arch, DecoderArch::Qwen3 | DecoderArch::Qwen35),
            sliding_window: None,
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_ids: id("tokenizer.ggml.eos_token_id").into_iter().collect(),
            hybrid: None,
            mrope: None,
            // llama.cpp's `bitnet` graph gates with SiLU; bitnet.cpp's `bitnet-b1.58` and
            // `bitnet-25` (BitNet b1.58 2B4T) with squared ReLU, as the checkpoint's config says.
            mlp_act: match model_type.as_str() {
                "bitnet-b1.58" | "bitnet-25" => MlpActivation::Relu2,
                _ => MlpActivation::Silu,
            },
        };
        if arch == DecoderArch::Qwen35 {
            cfg.hybrid = Some(HybridConfig::from_gguf(file, cfg.n_layers).map_err(bad)?);
        }
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.n_layers),
            ("num_attention_heads", self.n_heads),
            ("num_key_value_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_positions),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("`{name}` must be positive"));
            }
        }
        // Dimensions this large are corrupt files, not models (and would overflow sizes).
        for (name, v, limit) in [
            ("vocab_size", self.vocab_size, 1 << 24),
            ("hidden_size", self.hidden_size, 1 << 17),
            ("intermediate_size", self.intermediate_size, 1 << 19),
            ("num_hidden_layers", self.n_layers, 1 << 10),
            ("num_attention_heads", self.n_heads, 1 << 10),
            ("head_dim", self.head_dim, 1 << 12),
        ] {
            if v > limit {
                return Err(format!(
                    "`{name}` = {v} is implausibly large (limit {limit})"
                ));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.rope.rotary_dim == 0 || self.rope.rotary_dim > self.head_dim {
            return Err(format!(
                "rotary dimension {} must be in 1..={}",
                self.rope.rotary_dim, self.head_dim
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(format!("rms_norm_eps {} is invalid", self.rms_norm_eps));
        }
        Ok(())
    }
}

fn rope_scaling_from_json(
    p: &Value,
    max_positions: usize,
) -> std::result::Result<RopeScaling, String> {
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |k: &str| p.get(k).and_then(Value::as_f64).map(|f| f as f32);
    let factor = || num("factor").ok_or_else(|| format!("rope type `{kind}` needs `factor`"));
    let original = p
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
        .map_or(max_positions, |x| x as usize);
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor()? },
        "llama3" => RopeScaling::Llama3 {
            factor: factor()?,
            low_freq_factor: num("low_freq_factor").ok_or("llama3 rope needs `low_freq_factor`")?,
            high_freq_factor: num("high_freq_factor")
                .ok_or("llama3 rope needs `high_freq_factor`")?,
            original_max_position_embeddings: original,
        },
        "yarn" => RopeScaling::Yarn {
            factor: factor()?,
            original_max_position_embeddings: original,
            beta_fast: num("beta_fast").filter(|&b| b != 0.0).unwrap_or(32.0),
            beta_slow: num("beta_slow").filter(|&b| b != 0.0).unwrap_or(1.0),
            attention_factor: num("attention_factor"),
            mscale: num("mscale"),
            mscale_all_dim: num("mscale_all_dim"),
            truncate: p.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        },
        other => {
            return Err(format!(
                "rope type `{other}` is not supported (default, linear, llama3, yarn)"
            ))
        }
    })
}

/// Which outputs a forward pass over token ids computes ([`Decoder::forward`]; a
/// [`ForwardBatch`] can also ask for chosen rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outputs {
    /// Logits of the last new token of each sequence: f32 [n_seqs, vocab].
    LastLogits,
    /// Logits of every new token: f32 [n_tokens, vocab].
    AllLogits,
    /// Final-norm hidden states of every new token: f32 [n_tokens, hidden] (for embeddings).
    AllHidden,
}

impl From<Outputs> for RowOutputs {
    fn from(o: Outputs) -> Self {
        match o {
            Outputs::LastLogits => RowOutputs::LastLogits,
            Outputs::AllLogits => RowOutputs::AllLogits,
            Outputs::AllHidden => RowOutputs::AllHidden,
        }
    }
}

/// Shape facts about a loaded decoder.
#[derive(Debug, Clone)]
pub struct DecoderInfo {
    /// The configuration it was built from.
    pub config: DecoderConfig,
    /// How the weights are held (f32, or quantized blocks).
    pub weight_mode: WeightMode,
    /// Bytes of weights a single decode step reads (every matrix once).
    pub weight_bytes: usize,
    /// Where the weights, activations and KV pages live.
    pub device: Device,
    /// Unique per loaded model (keys what a device records of its steps).
    pub instance: u64,
}

/// A new [`DecoderInfo::instance`].
pub fn next_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Decode steps of at most this many sequences are recorded and replayed on devices that can.
pub const REPLAYED_ROWS: usize = 64;

/// A causal language model over per-sequence states.
pub trait Decoder: Send + Sync {
    /// Shape facts.
    fn info(&self) -> &DecoderInfo;

    /// An empty per-sequence state holding up to `max_len` tokens (capped at the model's
    /// context), in a pool of its own.
    fn new_cache(&self, max_len: usize) -> SeqState;

    /// Runs a batch: sequence `i` contributes `batch.seq_lens[i]` new rows after what
    /// `states[i]` already holds, and its state is extended by them. Returns what
    /// `batch.outputs` asks for.
    fn forward_batch(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
    ) -> Result<Vec<f32>> {
        crate::ops::device_pass(&self.info().device, || {
            crate::lora::with_row_adapters(batch.adapters.as_deref(), &batch.seq_lens, || {
                self.forward_on_pool(batch, states)
            })
        })
    }

    /// [`Decoder::forward_batch`] over token ids (`lens[i]` of them for sequence `i`, taken
    /// from `ids` in order), implicit positions, no adapters.
    fn forward(
        &self,
        ids: &[u32],
        lens: &[usize],
        caches: &mut [&mut SeqState],
        outputs: Outputs,
    ) -> Result<Vec<f32>> {
        self.forward_batch(&ForwardBatch::tokens(ids, lens, outputs.into()), caches)
    }

    /// [`Decoder::forward_batch`] for greedy decoding: the argmax token of the last row of each
    /// sequence (`batch.outputs` is ignored); [`Decoder::forward_pick`] with argmax picks.
    fn forward_greedy(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
    ) -> Result<Vec<u32>> {
        let picks = vec![Pick::argmax(); batch.seq_lens.len()];
        Ok(self
            .forward_pick(batch, states, &picks)?
            .into_iter()
            .map(|p| p.token)
            .collect())
    }

    /// [`Decoder::forward_batch`] that picks the next token of each sequence from its last
    /// row's logits by `picks[i]` (`batch.outputs` is ignored). Models on a GPU pick there
    /// ([`crate::ops::pick_rows`]), so only the ids come back; decode steps of a GPU are
    /// recorded and replayed (see [`crate::ops::launch_step`]).
    fn forward_pick(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
        picks: &[Pick],
    ) -> Result<Vec<Picked>> {
        let step = self.launch_pick(batch, states, picks, false)?;
        crate::ops::read_step(&self.info().device, step)
    }

    /// [`Decoder::forward_pick`] that does not wait for a replayed decode step's picks (read
    /// them with [`crate::ops::read_step`]), so the host can prepare the next step meanwhile.
    /// With `follows`, the batch's token ids are not used: each sequence's token is the one the
    /// step launched before this one picked for it (the same sequences in the same order),
    /// still on the device; only where [`Decoder::can_follow`] says so.
    fn launch_pick(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
        picks: &[Pick],
        follows: bool,
    ) -> Result<crate::ops::StepPicks> {
        if picks.len() != batch.seq_lens.len() {
            return Err(Error::InvalidInput(format!(
                "{} picks for a batch of {} sequences",
                picks.len(),
                batch.seq_lens.len()
            )));
        }
        let mut last = batch.clone();
        last.outputs = RowOutputs::LastLogits;
        let info = self.info();
        let sampling = !picks.iter().all(Pick::is_argmax);
        let key = replay_key(info, batch, states.len(), sampling);
        let adapters = last.adapters.as_deref();
        let run = |last: &ForwardBatch<'_>, states: &mut [&mut SeqState]| {
            crate::lora::with_row_adapters(adapters, &last.seq_lens, || {
                self.pick_on_pool(last, states, picks)
            })
        };
        crate::ops::device_pass(&info.device, || {
            let Some(key) = key else {
                if follows {
                    return Err(Error::InvalidInput(
                        "only a decode step can take its ids from the last step's picks".into(),
                    ));
                }
                return run(&last, states).map(crate::ops::StepPicks::Ready);
            };
            // Pages first, so a recorded step allocates none.
            for s in states.iter_mut() {
                s.reserve(1)?;
            }
            crate::ops::launch_step(&info.device, key, picks, follows, || run(&last, states))
        })
    }

    /// Whether a decode step of `batch` (one token per sequence; `sampling`: some row's pick
    /// is not the argmax) can take its ids from the picks of the step launched before it
    /// ([`Decoder::launch_pick`]'s `follows`): on a device that replays that step's recording.
    fn can_follow(&self, batch: &ForwardBatch<'_>, sampling: bool) -> bool {
        let info = self.info();
        let rows = batch.seq_lens.len();
        replay_key(info, batch, rows, sampling)
            .is_some_and(|key| crate::ops::replays(&info.device, key, rows))
    }

    /// [`Decoder::forward_pick`]'s body, inside [`crate::ops::device_pass`]; `batch` asks for
    /// the last rows' logits.
    fn pick_on_pool(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
        picks: &[Pick],
    ) -> Result<Vec<Picked>> {
        let logits = self.forward_on_pool(batch, states)?;
        let vocab = self.info().config.vocab_size;
        crate::ops::pick_rows(&Tensor::cpu(picks.len(), vocab, logits), picks)
    }

    /// [`Decoder::forward_batch`]'s body, run inside [`crate::ops::device_pass`] (on a worker
    /// of the CPU thread pool for a model on the CPU); implementations provide this one.
    fn forward_on_pool(
        &self,
        batch: &ForwardBatch<'_>,
        states: &mut [&mut SeqState],
    ) -> Result<Vec<f32>>;
}

/// The key of a decode step's recording ([`crate::ops::launch_step`]): model instance,
/// whether any row samples (`sampling`: argmax steps launch other kernels), the rows' LoRA
/// adapters. `None` when `batch` is not a decode step of `n_states` sequences that a device
/// records.
fn replay_key(
    info: &DecoderInfo,
    batch: &ForwardBatch<'_>,
    n_states: usize,
    sampling: bool,
) -> Option<u64> {
    let decode = matches!(batch.input, BatchInput::Tokens(_))
        && batch.seq_lens.iter().all(|&n| n == 1)
        && batch.seq_lens.len() <= REPLAYED_ROWS
        && batch.seq_lens.len() == n_states;
    if !decode {
        return None;
    }
    let key = (info.instance << 1) | u64::from(sampling);
    Some(match batch.adapters.as_deref() {
        Some(sel) => crate::lora::replay_key(key, sel),
        None => key,
    })
}

/// The input rows of a batch as a tensor on `device`: embedding rows of its token ids, or
/// its input embeddings as given, with any injected rows (images) added. f32 [rows, width].
pub(crate) fn embed_tensor(
    table: &EmbeddingTable,
    batch: &ForwardBatch<'_>,
    width: usize,
    device: &Device,
) -> Result<Tensor> {
    let mut x = match batch.input {
        BatchInput::Tokens(ids) => table.lookup_tensor(ids, device)?,
        BatchInput::Embeddings(x) => {
            Tensor::from_host(device, x.len() / width.max(1), width, x.to_vec())?
        }
    };
    batch.inject_embeddings(&mut x)?;
    Ok(x)
}

/// Ends a pass: commits the new rows to every state, then applies the final norm and head to
/// the rows `batch.outputs` asks for (`x` [rows, width], the residual stream, on any device;
/// the result stays there).
pub(crate) fn finish_tensor(
    x: Tensor,
    batch: &ForwardBatch<'_>,
    states: &mut [&mut SeqState],
    norm: &RmsNorm,
    head: Option<&Linear>,
) -> Result<Tensor> {
    for (&len, state) in batch.seq_lens.iter().zip(states.iter_mut()) {
        state.commit(len);
    }
    let mut hidden = match batch.output_rows() {
        Some(rows) => x.gather_rows(&rows)?,
        None => x,
    };
    match (&batch.outputs, head) {
        (RowOutputs::AllHidden, _) => {
            norm.apply(&mut hidden)?;
            Ok(hidden)
        }
        // The final norm inside the head's product where the device fuses it (one launch
        // fewer per step on a GPU), else the norm then the product.
        (_, Some(head)) => head.apply_normed(&hidden, norm),
        (_, None) => Err(Error::InvalidInput(
            "this model was loaded without its output head (as an encoder)".into(),
        )),
    }
}

pub use super::{load_decoder, load_decoder_from, load_decoder_on};
