//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`): loading
//! and validating them, and the low-rank parts a linear layer adds for them. A model is loaded
//! with a [`LoraPlan`] (in its [`Placement`](crate::model::source::Placement)): every projection
//! the adapters target gets `y += s · B (A x)` beside its weight, or the delta merged into the
//! weight at load (`merge`). Several adapters with scales form a mixture: their deltas add.
//!
//! This module owns the adapter files' meaning (scaling, rsLoRA, which options are refused); the
//! products live in `ops::Linear`.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

use crate::io::store::WeightStore;
use crate::{Error, Result};

/// What PEFT puts before a module's name in an adapter's tensor names.
const PEFT_PREFIX: &str = "base_model.model.";

/// One PEFT LoRA adapter.
#[derive(Debug)]
pub struct Adapter {
    dir: PathBuf,
    rank: usize,
    /// `lora_alpha / rank`, or `lora_alpha / sqrt(rank)` with rsLoRA.
    scaling: f32,
    tensors: WeightStore,
}

/// The adapter error for `dir`.
fn bad(dir: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidWeights {
        path: dir.to_path_buf(),
        reason: reason.into(),
    }
}

impl Adapter {
    /// Loads the adapter in `dir`, refusing what this engine does not apply (DoRA, biases,
    /// `modules_to_save`, per-module ranks, layer replication, activated LoRA, parameter
    /// targets, trainable tokens, fan-in-fan-out layouts, pickled `.bin` weights).
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cfg_path).map_err(|e| Error::io(&cfg_path, e))?;
        let cfg: Value = serde_json::from_str(&text)
            .map_err(|e| bad(&cfg_path, format!("not valid JSON: {e}")))?;
        let field = |k: &str| cfg.get(k).filter(|v| !v.is_null());
        if let Some(t) = field("peft_type").and_then(Value::as_str) {
            if t != "LORA" {
                return Err(bad(
                    &cfg_path,
                    format!("peft_type is {t}; only LORA adapters load"),
                ));
            }
        }
        let rank = field("r").and_then(Value::as_u64).unwrap_or(0) as usize;
        if rank == 0 {
            return Err(bad(&cfg_path, "`r` (the rank) must be a positive integer"));
        }
        let alpha = field("lora_alpha").and_then(Value::as_f64).unwrap_or(8.0);
        let refuse =
            |what: &str| -> Result<()> { Err(bad(&cfg_path, format!("{what} is not supported"))) };
        if field("use_dora").and_then(Value::as_bool) == Some(true) {
            refuse("`use_dora` (DoRA)")?;
        }
        if field("lora_bias").and_then(Value::as_bool) == Some(true) {
            refuse("`lora_bias` (a trained bias on B)")?;
        }
        for k in [
            "layer_replication",
            "alora_invocation_tokens",
            "target_parameters",
            "trainable_token_indices",
        ] {
            if field(k).is_some() {
                refuse(&format!("`{k}`"))?;
            }
        }
        if field("fan_in_fan_out").and_then(Value::as_bool) == Some(true) {
            refuse("`fan_in_fan_out` (Conv1D-layout base weights)")?;
        }
        if let Some(b) = field("bias").and_then(Value::as_str) {
            if b != "none" {
                refuse(&format!("`bias: \"{b}\"` (trained biases)"))?;
            }
        }
        if field("modules_to_save").is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty())) {
            refuse("`modules_to_save` (fully trained modules)")?;
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if field(k).is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
                refuse(&format!("`{k}` (per-module ranks or alphas)"))?;
            }
        }
        let rslora = field("use_rslora").and_then(Value::as_bool) == Some(true);
        let scaling = if rslora {
            alpha / (rank as f64).sqrt()
        } else {
            alpha / rank as f64
        } as f32;
        let weights = dir.join("adapter_model.safetensors");
        if !weights.is_file() {
            let why = if dir.join("adapter_model.bin").is_file() {
                "adapter_model.bin is a pickle, which is not loaded; save the adapter with \
                 safetensors (PEFT's default: `save_pretrained(..., safe_serialization=True)`)"
            } else {
                "adapter_model.safetensors not found"
            };
            return Err(bad(dir, why));
        }
        let tensors = WeightStore::open_files(dir, &[weights])?;
        Ok(Self {
            dir: dir.to_path_buf(),
            rank,
            scaling,
            tensors,
        })
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The scale its delta is multiplied by (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA).
    pub fn scaling(&self) -> f32 {
        self.scaling
    }

    /// The folder it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// One adapter's low-rank factors for a projection of `in_dim` inputs and `out_dim` outputs:
/// `a` f32 [rank, in_dim] and `b` f32 [out_dim, rank] with the adapter's scaling (times the
/// mixture's scale) folded in.
#[derive(Debug, Clone)]
pub struct LowRank {
    /// The down projection A.
    pub a: Vec<f32>,
    /// The up projection B, scaled.
    pub b: Vec<f32>,
    /// The rank.
    pub rank: usize,
    /// The adapter's index in its plan.
    pub adapter: usize,
}

thread_local! {
    /// The adapter of every row of the forward pass running on this thread (see
    /// [`with_row_adapters`]).
    static ROWS: std::cell::RefCell<Option<Vec<u32>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a decoder's forward pass, on the thread it runs on) with `rows` as the adapter of
/// every packed row: 0 for none, `k + 1` for adapter `k` of a selectable plan. Projections with
/// selectable adapters read it ([`row_adapters`]); a pass without a table runs the base model.
pub(crate) fn with_row_adapters<R>(rows: Option<&[u32]>, f: impl FnOnce() -> R) -> R {
    let prev = ROWS.with(|r| r.replace(rows.map(<[u32]>::to_vec)));
    let out = f();
    ROWS.with(|r| *r.borrow_mut() = prev);
    out
}

/// The row table of the pass in flight on this thread, if any.
pub(crate) fn row_adapters<R>(f: impl FnOnce(Option<&[u32]>) -> R) -> R {
    ROWS.with(|r| f(r.borrow().as_deref()))
}

/// The adapters a model is loaded with, each with a scale (a mixture adds their deltas), merged
/// into the weights at load or applied beside them; or, [`LoraPlan::selectable`], held beside
/// the weights for requests to pick one each (rows of one batch may use different adapters).
#[derive(Debug)]
pub struct LoraPlan {
    adapters: Vec<(Adapter, f32)>,
    merge: bool,
    selectable: bool,
    /// Tensor names the model's layers took (to refuse adapters for modules the model lacks).
    used: Mutex<HashSet<String>>,
}

impl LoraPlan {
    /// A plan over `adapters` and their scales; `merge` adds the deltas into the weights.
    pub fn new(adapters: Vec<(Adapter, f32)>, merge: bool) -> Self {
        Self {
            adapters,
            merge,
            selectable: false,
            used: Mutex::new(HashSet::new()),
        }
    }

    /// A plan whose adapters apply only to the rows of the requests that pick them
    /// ([`GenerateRequest::adapter`](crate::engine::GenerateRequest::adapter): its index here);
    /// other rows run the base model.
    pub fn selectable(adapters: Vec<Adapter>) -> Self {
        Self {
            adapters: adapters.into_iter().map(|a| (a, 1.0)).collect(),
            merge: false,
            selectable: true,
            used: Mutex::new(HashSet::new()),
        }
    }

    /// Whether requests pick the adapters ([`LoraPlan::selectable`]).
    pub fn is_selectable(&self) -> bool {
        self.selectable
    }

    /// Whether the deltas are merged into the weights at load.
    pub fn merges(&self) -> bool {
        self.merge
    }

    /// The adapters and their scales.
    pub fn adapters(&self) -> &[(Adapter, f32)] {
        &self.adapters
    }

    /// The factors of every adapter that targets the module named `module` (transformers'
    /// name, e.g. `model.layers.0.self_attn.q_proj`; `alias`, if given, is the name the
    /// checkpoint itself uses) of `in_dim` inputs and `out_dim` outputs. A shape that does not
    /// match is an error naming the tensor.
    pub fn factors(
        &self,
        module: &str,
        alias: Option<&str>,
        in_dim: usize,
        out_dim: usize,
    ) -> Result<Vec<LowRank>> {
        let mut out = Vec::new();
        for (k, (adapter, scale)) in self.adapters.iter().enumerate() {
            let names = std::iter::once(module).chain(alias);
            let Some(base) = names
                .map(|m| format!("{PEFT_PREFIX}{m}"))
                .find(|b| adapter.tensors.contains(&format!("{b}.lora_A.weight")))
            else {
                continue;
            };
            let (a_name, b_name) = (
                format!("{base}.lora_A.weight"),
                format!("{base}.lora_B.weight"),
            );
            let r = adapter.rank;
            let a = adapter.tensors.get(&a_name, &[r, in_dim])?;
            let b = adapter.tensors.get(&b_name, &[out_dim, r])?;
            let s = adapter.scaling * scale;
            out.push(LowRank {
                a: a.as_slice().to_vec(),
                b: b.as_slice().iter().map(|&v| v * s).collect(),
                rank: r,
                adapter: k,
            });
            let mut used = self
                .used
                .lock()
                .map_err(|_| bad(&adapter.dir, "poisoned"))?;
            used.insert(a_name);
            used.insert(b_name);
        }
        Ok(out)
    }

    /// After a model is loaded: an error naming the first adapter tensor no layer took (a
    /// module this model does not have, or one it does not take adapters on).
    pub fn check_all_used(&self) -> Result<()> {
        let used = self
            .used
            .lock()
            .map_err(|_| Error::InvalidInput("poisoned".into()))?;
        for (adapter, _) in &self.adapters {
            let mut names: Vec<&str> = adapter.tensors.names().collect();
            names.sort_unstable();
            if let Some(n) = names.into_iter().find(|n| !used.contains(*n)) {
                return Err(bad(
                    &adapter.dir,
                    format!(
                        "tensor `{n}` targets no projection of this model (LoRA applies to \
                         the attention and MLP projections and the output head)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `w [out_dim, in_dim] += B · A` for each factor (the merged weights).
pub fn merge_into(w: &mut [f32], in_dim: usize, factors: &[LowRank]) {
    for f in factors {
        for (row, b_row) in w.chunks_exact_mut(in_dim).zip(f.b.chunks_exact(f.rank)) {
            for (&bv, a_row) in b_row.iter().zip(f.a.chunks_exact(in_dim)) {
                if bv != 0.0 {
                    for (x, &av) in row.iter_mut().zip(a_row) {
                        *x += bv * av;
                    }
                }
            }
        }
    }
}
