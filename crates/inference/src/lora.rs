//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`): loading
//! and validating them, and the low-rank parts a linear layer adds for them. A model is loaded
//! with a [`LoraPlan`] (in its [`Placement`](crate::model::source::Placement)): every projection
//! the adapters target gets `y += s · B (A x)` beside its weight, or the delta merged into the
//! weight at load (`merge`). Several adapters with scales form a mixture: their deltas add.
//!
//! This module owns the adapter files' meaning (scaling, rsLoRA, which options are refused), the
//! mapping of adapters onto a model's projections ([`LoraPlan::prepare`], also while it serves)
//! and which adapters each row of a forward pass runs with ([`Selection`]); the products are
//! `ops::Linear`'s, the kernels the backends' (a factor's device copy is made on first use).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;

use crate::backend::cpu::{Delta, Values};
use crate::backend::Mirror;
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

    /// The factors of this adapter's pair for the module named by one of `names` (the
    /// transformers name first, then the checkpoint's own), as `(A name, B name, A [rank,
    /// in_dim], B [out_dim, rank])` (unscaled); `None` when it has none. A shape that does not
    /// match is an error naming the tensor.
    fn pair(&self, names: &[&str], in_dim: usize, out_dim: usize) -> Result<Option<Pair>> {
        let Some(base) = names
            .iter()
            .map(|m| format!("{PEFT_PREFIX}{m}"))
            .find(|b| self.tensors.contains(&format!("{b}.lora_A.weight")))
        else {
            return Ok(None);
        };
        let (a_name, b_name) = (
            format!("{base}.lora_A.weight"),
            format!("{base}.lora_B.weight"),
        );
        let r = self.rank;
        let a = self.tensors.get(&a_name, &[r, in_dim])?.as_slice().to_vec();
        let b = self
            .tensors
            .get(&b_name, &[out_dim, r])?
            .as_slice()
            .to_vec();
        Ok(Some((a_name, b_name, a, b)))
    }

    /// An error naming the first of this adapter's tensors not in `used`.
    fn check_used(&self, used: &HashSet<String>) -> Result<()> {
        let mut names: Vec<&str> = self.tensors.names().collect();
        names.sort_unstable();
        match names.into_iter().find(|n| !used.contains(*n)) {
            Some(n) => Err(bad(
                &self.dir,
                format!(
                    "tensor `{n}` targets no projection of this model (LoRA applies to the \
                     attention and MLP projections and the output head)"
                ),
            )),
            None => Ok(()),
        }
    }
}

/// An adapter's tensors for one module: `(A name, B name, A, B)` (see `Adapter::pair`).
type Pair = (String, String, Vec<f32>, Vec<f32>);

/// One adapter's low-rank factors for a projection of `in_dim` inputs and `out_dim` outputs,
/// for merging into its weight: `a` f32 [rank, in_dim] and `b` f32 [out_dim, rank] with the
/// adapter's scaling (times the mixture's scale) folded in.
#[derive(Debug, Clone)]
pub struct LowRank {
    /// The down projection A.
    pub a: Vec<f32>,
    /// The up projection B, scaled.
    pub b: Vec<f32>,
    /// The rank.
    pub rank: usize,
}

/// Where adapters attach: one layer's projection, or several stacked along its outputs.
#[derive(Debug)]
struct Site {
    /// `(first output column, outputs, names)` of each stacked projection: the transformers
    /// module name, then the checkpoint's own if it differs.
    parts: Vec<(usize, usize, Vec<String>)>,
    in_dim: usize,
    /// Runs over every row of the batch (not so: the output head, over the sampled rows).
    per_row: bool,
}

/// Factor values as the adapter file holds them: f32 (f16 widened at load), or bf16 kept in
/// 16 bits (half the bytes per product, the same numbers).
#[derive(Debug)]
enum Stored {
    F32(Vec<f32>),
    Bf16(Vec<u16>),
}

impl Stored {
    /// `v` as bf16 bits when `bf16` (the values came from bf16, so this is exact).
    fn new(v: Vec<f32>, bf16: bool) -> Self {
        if bf16 {
            Self::Bf16(v.iter().map(|x| (x.to_bits() >> 16) as u16).collect())
        } else {
            Self::F32(v)
        }
    }

    fn values(&self) -> Values<'_> {
        match self {
            Self::F32(v) => Values::F32(v),
            Self::Bf16(v) => Values::Bf16(v),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F32(v) => v.len() * 4,
            Self::Bf16(v) => v.len() * 2,
        }
    }

    /// The values as f32 (bf16 widened, exactly).
    #[cfg(feature = "cuda")]
    fn to_f32(&self) -> Vec<f32> {
        match self {
            Self::F32(v) => v.clone(),
            Self::Bf16(v) => v
                .iter()
                .map(|&b| f32::from_bits(u32::from(b) << 16))
                .collect(),
        }
    }
}

/// One adapter's factors for one stacked projection of a site.
#[derive(Debug)]
struct Factor {
    col: usize,
    rank: usize,
    /// A [rank, in_dim].
    a: Stored,
    /// Bᵀ [rank, outputs] (unscaled).
    bt: Stored,
    /// Device copies of `a` and `bt` (f32), made when a GPU first runs them.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    dev: (Mirror, Mirror),
}

/// One factor pair a row of a product adds, with its scale (the adapter's scaling times the
/// selection's), for a backend's low-rank kernel: the CPU kernel's form, and the factor whose
/// device copies a GPU runs.
#[derive(Clone, Copy)]
pub(crate) struct Term<'a> {
    delta: Delta<'a>,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    factor: &'a Factor,
}

impl<'a> AsRef<Delta<'a>> for Term<'a> {
    fn as_ref(&self) -> &Delta<'a> {
        &self.delta
    }
}

impl<'a> Term<'a> {
    /// The GPU kernel's form, uploading the factors to `dev` on first use.
    #[cfg(feature = "cuda")]
    pub(crate) fn cuda(
        &self,
        dev: &crate::backend::cuda::CudaDevice,
    ) -> Result<crate::backend::cuda::LowRankTerm<'a>> {
        let f = self.factor;
        Ok(crate::backend::cuda::LowRankTerm {
            a: f.dev.0.cuda_with(dev, || f.a.to_f32())?,
            bt: f.dev.1.cuda_with(dev, || f.bt.to_f32())?,
            rank: f.rank,
            col: f.col,
            scale: self.delta.scale,
        })
    }
}

/// An adapter mapped onto one model's projections, ready to run ([`LoraPlan::prepare`]).
#[derive(Debug)]
pub struct LoadedAdapter {
    /// Unique per preparation (a reloaded adapter gets a new one).
    id: u64,
    dir: PathBuf,
    rank: usize,
    /// `lora_alpha / r` (or `/ sqrt(r)`), applied with each selection's scale.
    scaling: f32,
    /// The plan it was prepared by (adapters run only on that plan's model).
    plan: u64,
    /// Factors per site of the plan.
    factors: Vec<Vec<Factor>>,
    bytes: usize,
}

impl LoadedAdapter {
    /// The folder it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Bytes its factors take in memory.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

/// The adapters a request runs with, each with a scale: their deltas add (a mixture). Empty is
/// the model's default: the adapters of a [`LoraPlan::new`] plan, none for a selectable one.
#[derive(Debug, Clone, Default)]
pub struct Selection(Arc<Vec<(Arc<LoadedAdapter>, f32)>>);

impl Selection {
    /// A selection of `adapters` with their scales (finite, adapters of one plan).
    pub fn new(adapters: Vec<(Arc<LoadedAdapter>, f32)>) -> Result<Self> {
        if let Some((a, s)) = adapters.iter().find(|(_, s)| !s.is_finite()) {
            return Err(bad(&a.dir, format!("scale {s} is not a finite number")));
        }
        if adapters.windows(2).any(|w| w[0].0.plan != w[1].0.plan) {
            return Err(Error::InvalidInput(
                "a selection mixes adapters prepared for different models".into(),
            ));
        }
        Ok(Self(Arc::new(adapters)))
    }

    /// No adapter picked.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The adapters and their scales.
    pub fn adapters(&self) -> &[(Arc<LoadedAdapter>, f32)] {
        &self.0
    }

    /// A key telling selections apart for the prefix cache: 0 when empty, else a hash of the
    /// adapters' identities and scales.
    pub fn key(&self) -> u64 {
        if self.0.is_empty() {
            return 0;
        }
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        for (a, s) in self.0.iter() {
            a.id.hash(&mut h);
            s.to_bits().hash(&mut h);
        }
        h.finish().max(1)
    }

    /// The plan the adapters were prepared by (`None` when empty).
    fn plan(&self) -> Option<u64> {
        self.0.first().map(|(a, _)| a.plan)
    }
}

/// `key` (a recorded decode step's) told apart by the adapters each row of the step picked
/// (`seqs`, one row per sequence): steps with the same picks launch the same low-rank kernels
/// with the same shapes, their factor addresses being step inputs.
pub(crate) fn replay_key(key: u64, seqs: &[Selection]) -> u64 {
    use std::hash::{Hash, Hasher};
    if seqs.iter().all(Selection::is_empty) {
        return key;
    }
    let mut h = std::hash::DefaultHasher::new();
    key.hash(&mut h);
    for s in seqs {
        s.key().hash(&mut h);
    }
    h.finish()
}

/// The selections of the forward pass running on one thread (see [`with_row_adapters`]).
struct RowTable {
    rows: Vec<Selection>,
    /// Some projection with adapters read the table.
    read: bool,
    /// Why the table does not fit the model, found by a projection.
    misfit: Option<&'static str>,
}

thread_local! {
    static ROWS: std::cell::RefCell<Option<RowTable>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` (a decoder's forward pass, on the thread it runs on) with `seqs[i]` as the adapters
/// of the `seq_lens[i]` packed rows of sequence `i` (an empty selection: the model's default);
/// without selections every row runs the default. An error when they do not fit the model
/// (adapters of another model, or a model loaded without adapters).
pub(crate) fn with_row_adapters<R>(
    seqs: Option<&[Selection]>,
    seq_lens: &[usize],
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let picks = seqs.is_some_and(|r| r.iter().any(|s| !s.is_empty()));
    let table = seqs.filter(|_| picks).map(|seqs| RowTable {
        rows: seqs
            .iter()
            .zip(seq_lens)
            .flat_map(|(s, &n)| std::iter::repeat_n(s.clone(), n))
            .collect(),
        read: false,
        misfit: None,
    });
    let prev = ROWS.with(|r| r.replace(table));
    let out = f();
    let table = ROWS.with(|r| r.replace(prev));
    let out = out?;
    if let Some(t) = table {
        if let Some(why) = t.misfit {
            return Err(Error::InvalidInput(why.into()));
        }
        if !t.read {
            return Err(Error::InvalidInput(
                "the batch picks LoRA adapters, but the model was loaded without LoRA support"
                    .into(),
            ));
        }
    }
    Ok(out)
}

/// Runs `f` with the terms every row of an `m`-row product at `site` of `plan` adds (from the
/// pass's row table, or the plan's default) and returns what it returns; `None`, without
/// calling `f`, when no row adds any.
pub(crate) fn with_terms<R>(
    plan: &LoraPlan,
    site: usize,
    m: usize,
    f: impl FnOnce(&[Vec<Term<'_>>]) -> R,
) -> Option<R> {
    // The selections are taken out of the table (cheap clones), so no borrow is held while
    // the kernel runs on the pool.
    let picked = ROWS.with(|r| {
        let mut table = r.borrow_mut();
        let t = table.as_mut()?;
        t.read = true;
        if !plan.selectable {
            t.misfit = Some(
                "the model applies its LoRA adapters to every request; load it with selectable \
                 adapters to pick them per request",
            );
        } else if t
            .rows
            .iter()
            .any(|s| s.plan().is_some_and(|p| p != plan.id))
        {
            t.misfit = Some("the batch picks LoRA adapters prepared for another model");
        }
        Some((t.misfit.is_none() && t.rows.len() == m).then(|| t.rows.clone()))
    });
    let rows: Vec<Vec<Term<'_>>>;
    let kept: Vec<Selection>;
    match picked {
        None => {
            let default = plan.default.get().filter(|d| !d.is_empty())?;
            let mut row = Vec::new();
            push_terms(default, site, &mut row);
            if row.is_empty() {
                return None;
            }
            rows = vec![row; m];
        }
        // A misfit, or the output head over the sampled rows (adapters picked per request
        // never have factors there, see `LoraPlan::prepare`).
        Some(None) => return None,
        Some(Some(selections)) => {
            kept = selections;
            rows = kept
                .iter()
                .map(|s| {
                    let mut row = Vec::new();
                    push_terms(s, site, &mut row);
                    row
                })
                .collect();
        }
    }
    if rows.iter().all(Vec::is_empty) {
        return None;
    }
    Some(f(&rows))
}

/// The terms `sel`'s adapters add at `site`, onto `out`.
fn push_terms<'a>(sel: &'a Selection, site: usize, out: &mut Vec<Term<'a>>) {
    for (adapter, scale) in sel.adapters() {
        for factor in adapter.factors.get(site).into_iter().flatten() {
            out.push(Term {
                delta: Delta {
                    a: factor.a.values(),
                    bt: factor.bt.values(),
                    rank: factor.rank,
                    col: factor.col,
                    scale: *scale * adapter.scaling,
                },
                factor,
            });
        }
    }
}

/// Tells plans apart (adapters run only on the model of the plan that prepared them), and
/// prepared adapters (the prefix cache keys their keys and values apart).
static IDS: AtomicU64 = AtomicU64::new(1);

/// The adapters a model is loaded with and how they apply: [`LoraPlan::new`] gives every
/// request the same adapters with their scales (a mixture adds their deltas), merged into the
/// weights at load or run beside them; [`LoraPlan::selectable`] holds them beside the weights
/// for requests to pick ([`Selection`]; rows of one batch may pick different ones), and more can
/// be prepared while the model serves ([`LoraPlan::prepare`]).
#[derive(Debug)]
pub struct LoraPlan {
    id: u64,
    adapters: Vec<(Adapter, f32)>,
    merge: bool,
    selectable: bool,
    /// Tensor names merged into the weights (to refuse adapters for modules the model lacks).
    used: Mutex<HashSet<String>>,
    /// The projections adapters attach to, recorded at load (unmerged plans).
    sites: Mutex<Vec<Site>>,
    /// What rows without a selection run: the adapters of a `new` plan, none if selectable.
    default: OnceLock<Selection>,
    /// The plan's own adapters prepared, in order (after [`LoraPlan::finish`]).
    loaded: OnceLock<Vec<Arc<LoadedAdapter>>>,
    /// The GPUs that keep step inputs for this plan's products (freed when it is dropped).
    #[cfg(feature = "cuda")]
    devices: Mutex<Vec<std::sync::Weak<crate::backend::cuda::CudaDevice>>>,
}

#[cfg(feature = "cuda")]
impl Drop for LoraPlan {
    fn drop(&mut self) {
        let devices = self
            .devices
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for dev in devices.iter().filter_map(std::sync::Weak::upgrade) {
            dev.drop_low_rank_inputs(self.id);
        }
    }
}

impl LoraPlan {
    fn with(adapters: Vec<(Adapter, f32)>, merge: bool, selectable: bool) -> Self {
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            adapters,
            merge,
            selectable,
            used: Mutex::new(HashSet::new()),
            sites: Mutex::new(Vec::new()),
            default: OnceLock::new(),
            loaded: OnceLock::new(),
            #[cfg(feature = "cuda")]
            devices: Mutex::new(Vec::new()),
        }
    }

    /// A plan over `adapters` and their scales for every request; `merge` adds the deltas into
    /// the weights.
    pub fn new(adapters: Vec<(Adapter, f32)>, merge: bool) -> Self {
        Self::with(adapters, merge, false)
    }

    /// A plan whose adapters apply only to the rows of the requests that pick them
    /// ([`GenerateRequest::lora`](crate::engine::GenerateRequest::lora)); other rows run the
    /// base model. `adapters` may be empty: [`LoraPlan::prepare`] adds more later.
    pub fn selectable(adapters: Vec<Adapter>) -> Self {
        Self::with(
            adapters.into_iter().map(|a| (a, 1.0)).collect(),
            false,
            true,
        )
    }

    /// Unique per plan (keys what a device keeps per product of this plan).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Notes that `dev` keeps step inputs for this plan's products: they are freed when the
    /// plan is dropped.
    #[cfg(feature = "cuda")]
    pub(crate) fn uses_device(&self, dev: &Arc<crate::backend::cuda::CudaDevice>) {
        if let Ok(mut devices) = self.devices.lock() {
            if !devices
                .iter()
                .any(|d| std::ptr::eq(d.as_ptr(), Arc::as_ptr(dev)))
            {
                devices.push(Arc::downgrade(dev));
            }
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

    /// The plan's own adapters, prepared (empty before the model is loaded or when merged).
    pub fn loaded(&self) -> &[Arc<LoadedAdapter>] {
        self.loaded.get().map_or(&[], Vec::as_slice)
    }

    /// Whether `selection` can run on this plan's model (an error saying why not).
    pub fn check(&self, selection: &Selection) -> Result<()> {
        match selection.plan() {
            None => Ok(()),
            Some(_) if !self.selectable => Err(Error::InvalidInput(
                "the model applies its LoRA adapters to every request; adapters are picked per \
                 request only on a model loaded with selectable adapters"
                    .into(),
            )),
            Some(p) if p != self.id => Err(Error::InvalidInput(
                "the request picks LoRA adapters prepared for another model".into(),
            )),
            Some(_) => Ok(()),
        }
    }

    /// The factors of every adapter that targets the module named by one of `names` (see
    /// [`Adapter::pair`]), for merging: B carries the adapter's scaling times its scale here.
    pub fn factors(&self, names: &[&str], in_dim: usize, out_dim: usize) -> Result<Vec<LowRank>> {
        let mut out = Vec::new();
        for (adapter, scale) in &self.adapters {
            let Some((a_name, b_name, a, mut b)) = adapter.pair(names, in_dim, out_dim)? else {
                continue;
            };
            b.iter_mut().for_each(|v| *v *= adapter.scaling * scale);
            out.push(LowRank {
                a,
                b,
                rank: adapter.rank,
            });
            let mut used = self.used.lock().map_err(|_| poisoned())?;
            used.insert(a_name);
            used.insert(b_name);
        }
        Ok(out)
    }

    /// Records a projection adapters attach to (unmerged plans): `(first output column,
    /// outputs, names)` of each stacked part over `in_dim` inputs; `per_row` unless it runs
    /// over the sampled rows only (the output head). Returns the site's index.
    pub(crate) fn add_site(
        &self,
        parts: Vec<(usize, usize, Vec<String>)>,
        in_dim: usize,
        per_row: bool,
    ) -> Result<usize> {
        let mut sites = self.sites.lock().map_err(|_| poisoned())?;
        sites.push(Site {
            parts,
            in_dim,
            per_row,
        });
        Ok(sites.len() - 1)
    }

    /// Maps `adapter` onto the model's projections: an error naming the tensor when one has
    /// the wrong shape or targets no projection. On a selectable plan the output head takes no
    /// adapter (it runs over the sampled rows of a batch, not each request's).
    pub fn prepare(&self, adapter: &Adapter) -> Result<Arc<LoadedAdapter>> {
        if self.merge {
            return Err(bad(
                &adapter.dir,
                "the model's adapters are merged into its weights; no more can be added",
            ));
        }
        let sites = self.sites.lock().map_err(|_| poisoned())?;
        let mut used = HashSet::new();
        let mut factors = Vec::with_capacity(sites.len());
        let mut bytes = 0;
        for site in sites.iter() {
            let mut here = Vec::new();
            for (col, n, names) in &site.parts {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let Some((a_name, b_name, a, b)) = adapter.pair(&names, site.in_dim, *n)? else {
                    continue;
                };
                if !site.per_row && self.selectable {
                    return Err(bad(
                        &adapter.dir,
                        format!(
                            "tensor `{a_name}`: adapters on the output head cannot be picked per \
                             request (it runs over the sampled rows of a batch); apply the \
                             adapter to every request instead (`lattice generate --lora`)"
                        ),
                    ));
                }
                let r = adapter.rank;
                let mut bt = vec![0.0f32; r * n];
                for (o, row) in b.chunks_exact(r).enumerate() {
                    for (k, &v) in row.iter().enumerate() {
                        bt[k * n + o] = v;
                    }
                }
                let bf16 = adapter.tensors.is_bf16(&a_name) && adapter.tensors.is_bf16(&b_name);
                let (a, bt) = (Stored::new(a, bf16), Stored::new(bt, bf16));
                bytes += a.bytes() + bt.bytes();
                here.push(Factor {
                    col: *col,
                    rank: r,
                    a,
                    bt,
                    dev: Default::default(),
                });
                used.insert(a_name);
                used.insert(b_name);
            }
            factors.push(here);
        }
        adapter.check_used(&used)?;
        Ok(Arc::new(LoadedAdapter {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            dir: adapter.dir.clone(),
            rank: adapter.rank,
            scaling: adapter.scaling,
            plan: self.id,
            factors,
            bytes,
        }))
    }

    /// After the model is loaded: merged plans check every adapter tensor was merged; others
    /// prepare their adapters (the default of a [`LoraPlan::new`] plan runs them all).
    pub(crate) fn finish(&self) -> Result<()> {
        if self.merge {
            let used = self.used.lock().map_err(|_| poisoned())?;
            for (adapter, _) in &self.adapters {
                adapter.check_used(&used)?;
            }
            return Ok(());
        }
        let mut loaded = Vec::with_capacity(self.adapters.len());
        for (adapter, _) in &self.adapters {
            loaded.push(self.prepare(adapter)?);
        }
        let default = if self.selectable {
            Selection::default()
        } else {
            let scaled = loaded
                .iter()
                .cloned()
                .zip(self.adapters.iter().map(|a| a.1));
            Selection::new(scaled.collect())?
        };
        let _ = self.default.set(default);
        let _ = self.loaded.set(loaded);
        Ok(())
    }
}

/// The error for a lock a panicking thread left.
fn poisoned() -> Error {
    Error::InvalidInput("a LoRA plan's lock was poisoned by a failed thread".into())
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
