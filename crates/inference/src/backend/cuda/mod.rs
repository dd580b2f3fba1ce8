//! The CUDA backend (cargo feature `cuda`): one [`CudaDevice`] per GPU holding its context, a
//! stream every op is queued on, a cuBLAS handle for the dense products and the kernels of
//! the `.cu` files here (`KERNELS`), compiled by NVRTC for the device's architecture when the
//! device is opened.
//! The driver, NVRTC and cuBLAS are loaded at run time (cudarc's dynamic loading), so a binary
//! built with the feature starts on machines without CUDA and `--device cuda` then fails with
//! a message naming the missing piece.
//!
//! This module owns device memory and launches; what the ops compute is defined by the CPU
//! backend, and tests/cuda_ops.rs holds every launcher here to it.
#![allow(unsafe_code)]

mod gdn;
mod graph;
pub(crate) mod launch;
mod lowrank;
mod paged;
mod quant;
mod sample;
mod shape;

pub use shape::Shape as RecordingShape;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use super::device::Op;
use crate::{Error, Result};

pub use gdn::GdnLaunch;
pub use graph::{Launched, LaunchedIds};
pub use launch::{AttnTiles, GemvInput, MatrixData};
pub use lowrank::LowRankTerm;
pub use paged::{attend_packed, attend_paged, attend_qkv_paged, QkvPrep};
pub use quant::{q8_matrix, BlockRows};

/// The kernel source (compiled at run time): the kernels, attention, the quantized products,
/// Qwen3.5's layers and the token picks.
pub const KERNELS: &str = concat!(
    include_str!("kernels.cu"),
    include_str!("attention.cu"),
    include_str!("quant.cu"),
    include_str!("gdn.cu"),
    include_str!("sample.cu")
);

/// f32 device memory: an allocation of its own, or, while a recorded step is replayed (no
/// kernel runs, so no value is ever read or written), a buffer lent by the device's replay
/// pool and handed back when dropped, so a replayed step's host pass allocates nothing.
pub struct Buf {
    slice: Option<CudaSlice<f32>>,
    lent: Option<Arc<ReplayPool>>,
}

impl From<CudaSlice<f32>> for Buf {
    fn from(slice: CudaSlice<f32>) -> Self {
        Buf {
            slice: Some(slice),
            lent: None,
        }
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({} f32)", self.len())
    }
}

impl std::ops::Deref for Buf {
    type Target = CudaSlice<f32>;
    fn deref(&self) -> &CudaSlice<f32> {
        self.slice
            .as_ref()
            .expect("a Buf holds its slice until dropped")
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut CudaSlice<f32> {
        self.slice
            .as_mut()
            .expect("a Buf holds its slice until dropped")
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let (Some(pool), Some(slice)) = (self.lent.take(), self.slice.take()) {
            pool.give(slice);
        }
    }
}

/// Buffers lent to replayed steps, by length (the same lengths recur every step).
#[derive(Default)]
pub(crate) struct ReplayPool(Mutex<HashMap<usize, Vec<CudaSlice<f32>>>>);

impl ReplayPool {
    fn take(&self, n: usize) -> Option<CudaSlice<f32>> {
        self.0.lock().ok()?.get_mut(&n)?.pop()
    }

    fn give(&self, slice: CudaSlice<f32>) {
        if let Ok(mut m) = self.0.lock() {
            m.entry(slice.len()).or_default().push(slice);
        }
    }

    /// Frees every buffer held (lent ones come back later).
    fn clear(&self) {
        if let Ok(mut m) = self.0.lock() {
            m.clear();
        }
    }
}

/// `LATTICE_CUDA_RECORD_POOL=0`: recordings allocate on the stream as eager steps do (to
/// measure the pool).
fn record_pool_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_RECORD_POOL").map_or(true, |v| v != "0"))
}

/// Whether the CUDA backend implements `op`.
pub fn supports(op: Op) -> bool {
    matches!(
        op,
        Op::LinearF32
            | Op::LinearBf16
            | Op::LinearQuant
            | Op::RmsNorm
            | Op::LayerNorm
            | Op::Rope
            | Op::SiluMul
            | Op::Gelu
            | Op::AttentionF32
            | Op::AttentionF16
            | Op::Argmax
            | Op::GatedDeltaNet
    )
}

fn err(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("cuda: {what}: {e:?}"))
}

/// The compiled kernels.
pub(crate) struct Kernels {
    pub rms_norm: CudaFunction,
    pub layer_norm: CudaFunction,
    pub rope: CudaFunction,
    pub silu_mul: CudaFunction,
    pub gelu: CudaFunction,
    pub add_bias: CudaFunction,
    pub low_rank_shrink: CudaFunction,
    pub low_rank_expand: CudaFunction,
    pub split_bf16: CudaFunction,
    pub add_halves: CudaFunction,
    pub copy_cols: CudaFunction,
    pub gather_rows: CudaFunction,
    pub embed_f32: CudaFunction,
    pub gemv_bf16: CudaFunction,
    /// The register-lean bf16 entries (launch.rs `gemv_bf16_entry`): half the load slots at
    /// most 72 registers (rows of k <= 1,024), and all of them at most 112.
    pub gemv_half_bf16: CudaFunction,
    pub gemv_capped_bf16: CudaFunction,
    pub gemv_f32: CudaFunction,
    pub gemv_q8: CudaFunction,
    /// The block types' matrix-vector kernels (quant.rs `block_layout`: Q4_0, Q4_1, Q5_0,
    /// Q4_K, Q6_K, Q8_0).
    pub gemv_blocks: [CudaFunction; 6],
    /// The block types' tiled kernels (same order).
    pub gemm_blocks: [CudaFunction; 6],
    /// Activation quantizers for the tiled kernels: per 32 (Q8_0 / Q8_1), per 256 (Q8_K).
    pub blk_quantize: [CudaFunction; 2],
    pub argmax_part: CudaFunction,
    pub argmax_merge: CudaFunction,
    pub pick_rows: CudaFunction,
    pub kv_write_f32: CudaFunction,
    pub kv_write_f16: CudaFunction,
    /// By head dimensions (launch::ATTN_HEAD_DIMS).
    pub attn_paged_f32: [CudaFunction; 4],
    pub attn_paged_f16: [CudaFunction; 4],
    /// By head dimensions (launch::ATTN_HEAD_DIMS).
    pub attn_decode_f32: [CudaFunction; 4],
    pub attn_decode_f16: [CudaFunction; 4],
    /// The same kernels with three blocks resident per SM, for steps of many (row, head) pairs.
    pub attn_decode_many_f32: [CudaFunction; 4],
    pub attn_decode_many_f16: [CudaFunction; 4],
    pub qkv_prep_f32: CudaFunction,
    pub qkv_prep_f16: CudaFunction,
    pub sigmoid_gate: CudaFunction,
    pub split_query_gate: CudaFunction,
    pub rms_norm_silu_gate: CudaFunction,
    pub gdn_conv: CudaFunction,
    /// By key head width (gdn::DELTA_KEY_DIMS).
    pub gdn_delta: [CudaFunction; 3],
    /// By key head width (gdn::DELTA_KEY_DIMS).
    pub gdn_chunked: [CudaFunction; 3],
}

/// One opened GPU.
pub struct CudaDevice {
    ordinal: usize,
    /// Streaming multiprocessors (sizes grids that must fill the GPU).
    sms: usize,
    /// Shared memory one block may use (bytes, with the opt-in).
    smem_optin: usize,
    /// See [`CudaDevice::decode_stage_limit`].
    decode_stage_limit: usize,
    name: String,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    /// Serializes cuBLAS calls (the handle is not safe to use from two threads at once).
    blas_lock: Mutex<()>,
    /// The last upload of each [`Input`]: host bytes and their device copy (a buffer that
    /// keeps its address while the bytes fit, so recorded steps read the new values).
    inputs: Mutex<HashMap<Input, InputBuf>>,
    /// Recorded decode steps and the mode of the step in flight (backend/cuda/graph.rs).
    graphs: graph::Graphs,
    /// What replayed steps' host passes allocate (see [`Buf`]).
    replay_pool: Arc<ReplayPool>,
    /// What recorded steps' kernels use: allocated outside the capture (on `side`), so that a
    /// recording holds no allocation or free nodes, which would stand between its kernels
    /// and keep each from starting while the one before it finishes (backend/cuda/shape.rs).
    /// Lent again to later recordings: recorded steps run one at a time on the stream, and
    /// their kernels, one after another, each wait for the one before them before touching
    /// memory, so a buffer given back in one recording is free for the next kernel on.
    record_pool: Arc<ReplayPool>,
    /// The stream that allocates `record_pool`'s buffers (made on first use).
    side: OnceLock<Arc<CudaStream>>,
    /// Tickets of split decode attention, one per (row, head) (`attn_decode` in attention.cu):
    /// zero between launches.
    decode_tickets: CudaSlice<u32>,
    /// Whether kernels are launched as programmatic dependents of the one before them
    /// (compute capability 9.0 and later, unless `LATTICE_CUDA_PDL=0`).
    dependent_launch: bool,
    /// Fewest keys a block of decode attention takes (a multiple of 32; `attn_decode`'s
    /// `min_span`): 128, or `LATTICE_CUDA_DECODE_SPAN`.
    decode_span: usize,
    /// Most rows whose token picks take a cluster of blocks per row (compute capability 9.0
    /// and later): those that fill the multiprocessors twice at most, or
    /// `LATTICE_CUDA_PICK_CLUSTERS=0` (none) or `all`.
    pick_cluster_rows: usize,
    /// Outputs beyond which a product of few rows takes cuBLAS ([`launch::GEMV_MAX_OUT`];
    /// `LATTICE_CUDA_GEMV_MAX_OUT` overrides, to measure the LM head in the matrix-vector
    /// kernel).
    gemv_max_out: usize,
    /// Whether bf16 matrix-vector products take the register-lean entries (launch.rs
    /// `gemv_bf16_entry`; `LATTICE_CUDA_GEMV_LEAN=1`, off until measured on a GPU).
    gemv_lean: bool,
    /// The kernels' module, kept where they were compiled with the kernel clock
    /// (`LATTICE_CUDA_DEFINES=LATTICE_KERNEL_CLOCK`, read under `LATTICE_CUDA_TRACE`).
    clock: Option<Arc<cudarc::driver::CudaModule>>,
    /// Most blocks per multiprocessor of a matrix-vector product: as many as fit at once
    /// (one wave; `LATTICE_CUDA_GEMV_BLOCKS` overrides, 0 = one block per 8 output columns).
    gemv_blocks_per_sm: usize,
}

/// A step input's last bytes on the host and its device buffer.
type InputBuf = (Vec<u8>, CudaSlice<u8>);

/// Small per-step inputs that every layer of a forward pass uploads alike (positions, page
/// tables, query tiles, row destinations, token ids). [`CudaDevice::input`] keeps the last
/// upload of each and skips uploads whose bytes did not change, so a pass uploads each once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// RoPE positions.
    RopePositions,
    /// Page-row addresses new keys and values are written to.
    KvDst,
    /// Attention tiles: sequence of each.
    TileSeq,
    /// Attention tiles: first row of each.
    TileRow0,
    /// Attention tiles: rows of each.
    TileRows,
    /// Attention: position of each query row.
    RowPositions,
    /// Attention: page addresses of every sequence.
    Pages,
    /// Attention: each sequence's first page in `Pages`.
    FirstPages,
    /// Token ids of an embedding lookup.
    TokenIds,
    /// Row indices of a gather.
    RowIndices,
    /// Gated DeltaNet: the address of every sequence's recurrent-state block.
    RecurrentStates,
    /// Gated DeltaNet: each sequence's first row, and the end (n_seqs + 1 offsets).
    SeqRows,
    /// Token picks: each row's parameters.
    PickRows,
    /// Token picks: the rows' (id, value) pairs (logit bias, penalties).
    PickPairs,
    /// Low-rank (LoRA) updates: each row's factor pairs for one product, by the product's key
    /// (its plan and site; see `add_low_rank`).
    LowRank(u64, usize),
}

/// Most rows whose token picks take a cluster of blocks per row: none before compute
/// capability 9.0 or with `LATTICE_CUDA_PICK_CLUSTERS=0`, every launch with `all`, else
/// (unset or `1`) launches that fill the multiprocessors twice at most.
fn pick_cluster_rows(cc: (i32, i32), sms: usize) -> Result<usize> {
    let few = 2 * sms / sample::PICK_CLUSTER;
    Ok(
        match std::env::var("LATTICE_CUDA_PICK_CLUSTERS").as_deref() {
            _ if cc.0 < 9 => 0,
            Ok("0") => 0,
            Ok("all") => usize::MAX,
            Ok("1") | Err(_) => few,
            Ok(v) => {
                return Err(Error::Device(format!(
                    "cuda: LATTICE_CUDA_PICK_CLUSTERS: `{v}` is not 0, 1 or all"
                )))
            }
        },
    )
}

/// NVRTC options: C++17, and the defines that select a kernel's earlier form for A/B
/// measurements: `LATTICE_CUDA_EARLY_TRIGGER=0` (DEP_ENTER in kernels.cu), and the names in
/// `LATTICE_CUDA_DEFINES` (separated by commas or colons, e.g. `LATTICE_KERNEL_CLOCK`; colons
/// keep a list inside one of `scripts/gpu/ab_decode.sh`'s comma-separated settings).
fn kernel_options() -> Result<Vec<String>> {
    let mut options = vec!["--std=c++17".to_string()];
    if std::env::var("LATTICE_CUDA_EARLY_TRIGGER").is_ok_and(|v| v == "0") {
        options.push("-DLATTICE_LATE_TRIGGER".into());
    }
    if let Ok(names) = std::env::var("LATTICE_CUDA_DEFINES") {
        for n in names.split([',', ':']).filter(|n| !n.is_empty()) {
            if !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(Error::Device(format!(
                    "cuda: LATTICE_CUDA_DEFINES: `{n}` is not a C identifier"
                )));
            }
            options.push(format!("-D{n}"));
        }
    }
    Ok(options)
}

/// A count from environment variable `name`, or `default` when it is unset; a value that is
/// not a count is an error naming the variable.
fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v.trim().parse().map_err(|_| {
            Error::Device(format!(
                "cuda: {name}={v:?} is not a count (a whole number)"
            ))
        }),
    }
}

/// Compiles the kernel source for compute capability `cc` to PTX (also usable without a GPU,
/// given NVRTC: tests compile the kernels on machines without one).
pub fn compile_kernels(cc: (i32, i32)) -> Result<cudarc::nvrtc::Ptx> {
    // SAFETY: only probes whether the shared library can be loaded.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "cuda: NVRTC (libnvrtc.so) could not be loaded; add the CUDA toolkit's lib64 folder \
             to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let arch: &'static str = Box::leak(format!("compute_{}{}", cc.0, cc.1).into_boxed_str());
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some(arch),
        options: kernel_options()?,
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(KERNELS, opts)
        .map_err(|e| Error::Device(format!("cuda: compiling kernels.cu for {arch}: {e}")))
}

impl CudaDevice {
    /// Opens GPU `ordinal` (once per process; later calls share it).
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let mut open = OPEN
            .get_or_init(Default::default)
            .lock()
            .map_err(|_| Error::Device("cuda: device table poisoned".into()))?;
        if let Some(d) = open.get(&ordinal) {
            return Ok(Arc::clone(d));
        }
        let d = Arc::new(Self::open_new(ordinal)?);
        open.insert(ordinal, Arc::clone(&d));
        Ok(d)
    }

    fn open_new(ordinal: usize) -> Result<CudaDevice> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Device(format!(
                "cuda:{ordinal}: no CUDA driver (libcuda.so could not be loaded; is an NVIDIA \
                 driver installed?)"
            )));
        }
        let count = CudaContext::device_count().map_err(|e| err("counting devices", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(Error::Device(format!(
                "cuda:{ordinal}: no such device (this machine has {count} CUDA device{})",
                if count == 1 { "" } else { "s" }
            )));
        }
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(Error::Device(format!(
                "cuda:{ordinal}: cuBLAS (libcublas.so) could not be loaded; add the CUDA \
                 toolkit's lib64 folder to LD_LIBRARY_PATH"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| err("creating a context", e))?;
        // One stream carries every op, so cudarc's per-buffer events are not needed.
        // SAFETY: all work of this device is queued on the one stream made below.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(|e| err("device name", e))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| err("multiprocessor count", e))?
            .max(1) as usize;
        let smem_optin = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| err("shared memory per block", e))?
            .max(0) as usize;
        let cc = ctx
            .compute_capability()
            .map_err(|e| err("compute capability", e))?;
        keep_freed_memory(&ctx);
        let stream = ctx.new_stream().map_err(|e| err("creating a stream", e))?;
        let blas = CudaBlas::new(Arc::clone(&stream)).map_err(|e| err("creating cuBLAS", e))?;
        let module = ctx
            .load_module(compile_kernels(cc)?)
            .map_err(|e| err("loading the kernels", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| err(&format!("kernel `{name}`"), e))
        };
        let kernels = Kernels {
            rms_norm: f("rms_norm")?,
            layer_norm: f("layer_norm")?,
            rope: f("rope")?,
            silu_mul: f("silu_mul")?,
            gelu: f("gelu")?,
            add_bias: f("add_bias")?,
            low_rank_shrink: f("low_rank_shrink")?,
            low_rank_expand: f("low_rank_expand")?,
            split_bf16: f("split_bf16")?,
            add_halves: f("add_halves")?,
            copy_cols: f("copy_cols")?,
            gather_rows: f("gather_rows")?,
            embed_f32: f("embed_f32")?,
            gemv_bf16: f("gemv_bf16")?,
            gemv_half_bf16: f("gemv_half_bf16")?,
            gemv_capped_bf16: f("gemv_capped_bf16")?,
            gemv_f32: f("gemv_f32")?,
            gemv_q8: f("gemv_q8")?,
            gemv_blocks: [
                f("gemv_q4_0")?,
                f("gemv_q4_1")?,
                f("gemv_q5_0")?,
                f("gemv_q4_k")?,
                f("gemv_q6_k")?,
                f("gemv_q8_0")?,
            ],
            gemm_blocks: [
                f("gemm_q4_0")?,
                f("gemm_q4_1")?,
                f("gemm_q5_0")?,
                f("gemm_q4_k")?,
                f("gemm_q6_k")?,
                f("gemm_q8_0")?,
            ],
            blk_quantize: [f("blk_quantize_32")?, f("blk_quantize_256")?],
            argmax_part: f("argmax_part")?,
            argmax_merge: f("argmax_merge")?,
            pick_rows: f("pick_rows")?,
            kv_write_f32: f("kv_write_f32")?,
            kv_write_f16: f("kv_write_f16")?,
            attn_paged_f32: [
                f("attn_paged_f32_d1")?,
                f("attn_paged_f32_d2")?,
                f("attn_paged_f32_d4")?,
                f("attn_paged_f32_d8")?,
            ],
            attn_paged_f16: [
                f("attn_paged_f16_d1")?,
                f("attn_paged_f16_d2")?,
                f("attn_paged_f16_d4")?,
                f("attn_paged_f16_d8")?,
            ],
            attn_decode_f32: [
                f("attn_decode_f32_d1")?,
                f("attn_decode_f32_d2")?,
                f("attn_decode_f32_d4")?,
                f("attn_decode_f32_d8")?,
            ],
            attn_decode_f16: [
                f("attn_decode_f16_d1")?,
                f("attn_decode_f16_d2")?,
                f("attn_decode_f16_d4")?,
                f("attn_decode_f16_d8")?,
            ],
            attn_decode_many_f32: [
                f("attn_decode_many_f32_d1")?,
                f("attn_decode_many_f32_d2")?,
                f("attn_decode_many_f32_d4")?,
                f("attn_decode_many_f32_d8")?,
            ],
            attn_decode_many_f16: [
                f("attn_decode_many_f16_d1")?,
                f("attn_decode_many_f16_d2")?,
                f("attn_decode_many_f16_d4")?,
                f("attn_decode_many_f16_d8")?,
            ],
            qkv_prep_f32: f("qkv_prep_f32")?,
            qkv_prep_f16: f("qkv_prep_f16")?,
            sigmoid_gate: f("sigmoid_gate")?,
            split_query_gate: f("split_query_gate")?,
            rms_norm_silu_gate: f("rms_norm_silu_gate")?,
            gdn_conv: f("gdn_conv")?,
            gdn_delta: [
                f("gdn_delta_k32")?,
                f("gdn_delta_k64")?,
                f("gdn_delta_k128")?,
            ],
            gdn_chunked: [
                f("gdn_chunked_k32")?,
                f("gdn_chunked_k64")?,
                f("gdn_chunked_k128")?,
            ],
        };
        // Kernels that stage more than the default 48 KiB of shared memory.
        let smem = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        let attn = (kernels.attn_paged_f32.iter().zip(launch::ATTN_HEAD_DIMS))
            .chain(kernels.attn_paged_f16.iter().zip(launch::ATTN_HEAD_DIMS))
            .map(|(k, hd)| (k, launch::attn_smem_bytes(hd)))
            .chain(
                (kernels.gdn_chunked.iter().zip(gdn::DELTA_KEY_DIMS))
                    .map(|(k, dk)| (k, gdn::chunk_smem_bytes(dk))),
            )
            .chain((kernels.gemv_blocks.iter()).map(|k| (k, launch::GEMV_SMEM_BYTES)));
        // Decode attention's staging (launch::decode_stage_bytes), where the device has room
        // for it beside the kernel's own ~6 KiB.
        let stage_limit = smem_optin.saturating_sub(16 << 10);
        let staging = (kernels.attn_decode_f32.iter().zip(launch::ATTN_HEAD_DIMS))
            .map(|(k, hd)| (k, launch::decode_stage_bytes(hd, false)))
            .chain(
                (kernels.attn_decode_f16.iter().zip(launch::ATTN_HEAD_DIMS))
                    .map(|(k, hd)| (k, launch::decode_stage_bytes(hd, true))),
            )
            .filter(|&(_, bytes)| bytes <= stage_limit);
        for (k, bytes) in attn.chain(staging).chain([
            (&kernels.gemv_bf16, launch::GEMV_SMEM_BYTES),
            (&kernels.gemv_half_bf16, launch::GEMV_SMEM_BYTES),
            (&kernels.gemv_capped_bf16, launch::GEMV_SMEM_BYTES),
            (&kernels.gemv_f32, launch::GEMV_SMEM_BYTES),
            (&kernels.gemv_q8, launch::GEMV_SMEM_BYTES),
            (&kernels.pick_rows, sample::PICK_SMEM_BYTES),
        ]) {
            if bytes > smem_optin {
                continue; // launches needing it are refused (CudaDevice::max_smem)
            }
            k.set_attribute(smem, bytes as i32)
                .map_err(|e| err("raising a kernel's shared memory", e))?;
        }
        // Matrix-vector products run in one wave of resident blocks (measured on an H200:
        // tg 789-799 tokens/s at its 2 blocks per SM, 686-691 with a block per 8 columns, 704-716
        // with 3 or 4 per SM, which then run in two waves).
        let resident = kernels
            .gemv_bf16
            .occupancy_max_active_blocks_per_multiprocessor(256, 8 * 1024, None)
            .map_or(2, |b| b.max(1) as usize);
        let gemv_blocks_per_sm = env_count("LATTICE_CUDA_GEMV_BLOCKS", resident)?;
        if graph::tracing() {
            eprintln!(
                "cuda: {name}: {sms} SMs; matrix-vector products of at most {gemv_blocks_per_sm} blocks per SM ({resident} resident)"
            );
        }
        let decode_tickets = stream
            .alloc_zeros::<u32>(launch::DECODE_TICKETS)
            .map_err(|e| err("allocating attention tickets", e))?;
        // `LATTICE_CUDA_ATTN_STAGE=0` turns decode attention's staging off (to measure it).
        let decode_stage_limit = match std::env::var("LATTICE_CUDA_ATTN_STAGE") {
            Ok(v) if v == "0" => 0,
            _ => stage_limit,
        };
        Ok(CudaDevice {
            decode_tickets,
            decode_stage_limit,
            ordinal,
            sms,
            smem_optin,
            name,
            stream,
            blas,
            kernels,
            blas_lock: Mutex::new(()),
            inputs: Mutex::new(HashMap::new()),
            graphs: graph::Graphs::default(),
            replay_pool: Arc::default(),
            record_pool: Arc::default(),
            side: OnceLock::new(),
            dependent_launch: cc.0 >= 9
                && std::env::var("LATTICE_CUDA_PDL").map_or(true, |v| v != "0"),
            pick_cluster_rows: pick_cluster_rows(cc, sms)?,
            decode_span: env_count("LATTICE_CUDA_DECODE_SPAN", launch::DECODE_SPAN)?
                .clamp(1, 1 << 20)
                .div_ceil(32)
                * 32,
            gemv_max_out: env_count("LATTICE_CUDA_GEMV_MAX_OUT", launch::GEMV_MAX_OUT)?,
            gemv_lean: env_count("LATTICE_CUDA_GEMV_LEAN", 0)? != 0,
            clock: kernel_options()?
                .iter()
                .any(|o| o == "-DLATTICE_KERNEL_CLOCK")
                .then_some(module),
            gemv_blocks_per_sm,
        })
    }

    /// Whether kernels start while the kernel before them finishes (programmatic dependent
    /// launch; `LATTICE_CUDA_PDL=0` turns it off to measure what it saves).
    pub fn dependent_launch(&self) -> bool {
        self.dependent_launch
    }

    /// Most rows whose token picks take a cluster of blocks per row (`sample.rs`).
    pub(crate) fn pick_cluster_rows(&self) -> usize {
        self.pick_cluster_rows
    }

    /// Fewest keys a decode attention block takes (splits of a short context).
    pub(crate) fn decode_span(&self) -> usize {
        self.decode_span
    }

    /// The module holding the kernel clock, where the kernels keep one.
    pub(crate) fn clock_module(&self) -> Option<&Arc<cudarc::driver::CudaModule>> {
        self.clock.as_ref()
    }

    /// The grid of a matrix-vector product with `n` outputs (8 per block, fewer blocks
    /// taking several columns per warp when capped).
    pub(crate) fn gemv_blocks(&self, n: usize) -> usize {
        let all = n.div_ceil(8);
        match self.gemv_blocks_per_sm {
            0 => all,
            b => all.min(b * self.sms),
        }
    }

    /// The number of streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sms
    }

    /// Shared memory one block may use, in bytes.
    pub fn max_smem(&self) -> usize {
        self.smem_optin
    }

    /// Dynamic shared memory a decode attention launch may stage keys in (0: no staging).
    pub(crate) fn decode_stage_limit(&self) -> usize {
        self.decode_stage_limit
    }

    /// The device number.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// (free, total) device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.stream
            .context()
            .mem_get_info()
            .map_err(|e| err("memory info", e))
    }

    /// Waits for every queued op.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| err("synchronize", e))
    }

    /// Uninitialized device memory for `n` values.
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every caller writes the buffer (by a kernel or a copy) before reading it.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| err("allocating", e))
    }

    /// f32 memory for `n` values. While a step is recorded it comes from the record pool
    /// (allocated outside the capture, so the graph holds no allocation nodes between kernels);
    /// while a recorded step is replayed, from the replay pool (see [`Buf`]). Every caller writes
    /// it (by a kernel or a copy) before reading it.
    pub fn alloc_buf(&self, n: usize) -> Result<Buf> {
        let n = n.max(1);
        if self.graphs.recording() && record_pool_enabled() {
            let slice = match self.record_pool.take(n) {
                Some(s) => s,
                None => self.alloc_aside(n)?,
            };
            return Ok(Buf {
                slice: Some(slice),
                lent: Some(Arc::clone(&self.record_pool)),
            });
        }
        if !self.replaying() {
            return Ok(self.alloc::<f32>(n)?.into());
        }
        let slice = match self.replay_pool.take(n) {
            Some(s) => s,
            None => self.alloc::<f32>(n)?,
        };
        Ok(Buf {
            slice: Some(slice),
            lent: Some(Arc::clone(&self.replay_pool)),
        })
    }

    /// Drops every recorded step, and the buffers their kernels used once the device is done
    /// with them (kept if it cannot tell).
    pub(crate) fn clear_recordings(&self) {
        let idle = self.synchronize().is_ok();
        self.graphs.clear();
        if idle {
            self.record_pool.clear();
        }
    }

    /// `n` f32 values allocated on the side stream and ready (outside any capture of the
    /// device's stream).
    fn alloc_aside(&self, n: usize) -> Result<CudaSlice<f32>> {
        let side = match self.side.get() {
            Some(s) => s,
            None => {
                let s = self
                    .stream
                    .context()
                    .new_stream()
                    .map_err(|e| err("making the allocation stream", e))?;
                self.side.get_or_init(|| s)
            }
        };
        // SAFETY: every caller writes the buffer (by a kernel or a copy) before reading it.
        let slice = unsafe { side.alloc::<f32>(n) }.map_err(|e| err("allocating", e))?;
        side.synchronize()
            .map_err(|e| err("allocating (waiting for the allocation stream)", e))?;
        Ok(slice)
    }

    /// A device copy of `host`.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            return self.alloc(1);
        }
        self.stream
            .clone_htod(host)
            .map_err(|e| err("copying to the device", e))
    }

    /// The first `n` values of `buf`, copied to the host (waits for the queued ops).
    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        buf: &CudaSlice<T>,
        n: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            self.stream
                .memcpy_dtoh(&buf.slice(..n), &mut out)
                .map_err(|e| err("copying to the host", e))?;
            self.synchronize()?;
        }
        Ok(out)
    }

    /// f32 zeros for `n` values (an allocation of its own, never lent by the replay pool).
    pub fn zeros(&self, n: usize) -> Result<Buf> {
        let slice = self
            .stream
            .alloc_zeros::<f32>(n.max(1))
            .map_err(|e| err("allocating zeros", e))?;
        Ok(slice.into())
    }

    /// Copies the first `n` values of `src` into `dst` (in stream order).
    pub fn copy_within(&self, src: &Buf, dst: &mut Buf, n: usize) -> Result<()> {
        assert!(src.len() >= n && dst.len() >= n);
        if n == 0 || self.replaying() {
            return Ok(());
        }
        self.stream
            .memcpy_dtod(&src.slice(..n), &mut dst.slice_mut(..n))
            .map_err(|e| err("device copy", e))
    }

    /// Sets the first `n` values of `buf` to zero (in stream order).
    pub fn fill_zero(&self, buf: &mut Buf, n: usize) -> Result<()> {
        assert!(buf.len() >= n);
        if n == 0 || self.replaying() {
            return Ok(());
        }
        self.stream
            .memset_zeros(&mut buf.slice_mut(..n))
            .map_err(|e| err("zeroing device memory", e))
    }

    /// A device copy of `src`'s first `n` values.
    pub fn duplicate<T: DeviceRepr>(&self, src: &CudaSlice<T>, n: usize) -> Result<CudaSlice<T>> {
        let mut dst = self.alloc::<T>(n)?;
        if n > 0 && !self.replaying() {
            self.stream
                .memcpy_dtod(&src.slice(..n), &mut dst.slice_mut(..n))
                .map_err(|e| err("device copy", e))?;
        }
        Ok(dst)
    }

    /// The device address of a copy of `data` for `slot`, uploading only when the bytes differ
    /// from the slot's last upload. A slot's buffer keeps its address while new bytes fit (they
    /// are copied in, in stream order, so ops queued earlier read the old values first); a
    /// larger upload moves it, and recorded steps are then dropped. While a step is recorded
    /// the copy is deferred to just before the recording first runs.
    pub fn input<T: bytemuck::Pod>(&self, slot: Input, data: &[T]) -> Result<u64> {
        self.timed(graph::HostPart::Inputs, || {
            self.input_bytes(slot, bytemuck::cast_slice(data))
        })
    }

    /// [`CudaDevice::input`]; in a step that follows the one before it
    /// ([`CudaDevice::graph_launch`]), token ids are then overwritten by that step's picks.
    fn input_bytes(&self, slot: Input, bytes: &[u8]) -> Result<u64> {
        let p = self.upload_input(slot, bytes)?;
        if slot == Input::TokenIds && self.graphs.following() {
            self.ids_from_output(p, bytes.len())?;
        }
        Ok(p)
    }

    fn upload_input(&self, slot: Input, bytes: &[u8]) -> Result<u64> {
        let mut inputs = self
            .inputs
            .lock()
            .map_err(|_| Error::Device("cuda: input table poisoned".into()))?;
        if let Some((host, dev)) = inputs.get_mut(&slot) {
            if host.as_slice() == bytes {
                return Ok(self.ptr(dev));
            }
            if dev.len() >= bytes.len() {
                let p = self.ptr(dev);
                host.clear();
                host.extend_from_slice(bytes);
                self.copy_input(p, bytes)?;
                return Ok(p);
            }
        }
        if self.graph_mode() {
            return Err(Error::Device(format!(
                "cuda: step input {slot:?} outgrew its buffer while a step was recorded"
            )));
        }
        // Room to grow, so later steps of a recorded shape keep the address.
        let cap = (2 * bytes.len()).max(64 << 10);
        let mut dev = self.alloc::<u8>(cap)?;
        let p = self.ptr(&dev);
        if !bytes.is_empty() {
            self.stream
                .memcpy_htod(bytes, &mut dev.slice_mut(..bytes.len()))
                .map_err(|e| err("copying a step input", e))?;
        }
        inputs.insert(slot, (bytes.to_vec(), dev));
        self.clear_recordings();
        Ok(p)
    }

    /// Frees the step inputs of LoRA plan `plan`'s products (the plan is gone) and drops the
    /// recorded steps, which may read them.
    pub fn drop_low_rank_inputs(&self, plan: u64) {
        if let Ok(mut inputs) = self.inputs.lock() {
            let before = inputs.len();
            inputs.retain(|slot, _| !matches!(slot, Input::LowRank(p, _) if *p == plan));
            if inputs.len() != before {
                self.clear_recordings();
            }
        }
    }

    /// Step inputs this device keeps for LoRA products (what [`Self::drop_low_rank_inputs`]
    /// frees; for tests).
    pub fn low_rank_inputs(&self) -> usize {
        self.inputs.lock().map_or(0, |inputs| {
            inputs
                .keys()
                .filter(|slot| matches!(slot, Input::LowRank(..)))
                .count()
        })
    }

    /// Makes `slot`'s buffer hold at least `bytes` before a recorded step runs: a step input
    /// cannot move while a step is replayed, so one that is about to outgrow its buffer moves
    /// here, outside the step (and the recordings that read it are dropped).
    pub fn reserve_input(&self, slot: Input, bytes: usize) -> Result<()> {
        if self.graph_mode() {
            return Ok(());
        }
        let mut inputs = self
            .inputs
            .lock()
            .map_err(|_| Error::Device("cuda: input table poisoned".into()))?;
        if inputs.get(&slot).is_some_and(|(_, dev)| dev.len() >= bytes) {
            return Ok(());
        }
        let dev = self.alloc::<u8>((2 * bytes).max(64 << 10))?;
        // No host bytes: the next upload copies whatever it holds.
        inputs.insert(slot, (Vec::new(), dev));
        self.clear_recordings();
        Ok(())
    }

    /// Copies `bytes` to device address `p` in stream order (deferred while recording).
    fn copy_input(&self, p: u64, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        if self.graphs.recording() {
            self.graphs.defer_copy(p, bytes.to_vec());
            return Ok(());
        }
        // SAFETY: `p` is the start of a live input buffer of at least `bytes.len()` bytes
        // (checked by the caller); the copy is queued on the device's stream.
        unsafe { cudarc::driver::result::memcpy_htod_async(p, bytes, self.stream.cu_stream()) }
            .map_err(|e| err("copying a step input", e))
    }

    /// The raw address of `buf` (for kernels that take addresses, e.g. page tables).
    pub fn ptr<T>(&self, buf: &CudaSlice<T>) -> u64 {
        let (p, _sync) = buf.device_ptr(&self.stream);
        p
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn kernels(&self) -> &Kernels {
        &self.kernels
    }
}

/// Lets the driver's default memory pool keep freed memory for the next allocations instead
/// of returning it at every synchronization (activations are allocated and freed every step).
fn keep_freed_memory(ctx: &Arc<CudaContext>) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` is written by the driver for a valid device of the current context; the
    // attribute takes a pointer to a u64. Failure only costs speed, so results are ignored.
    unsafe {
        if ctx.bind_to_thread().is_ok()
            && sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
        {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({}, {})", self.ordinal, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::env_count;

    #[test]
    fn env_counts_refuse_what_is_not_a_count() {
        // A variable only this test sets, so parallel tests do not see it change.
        let name = "LATTICE_TEST_ENV_COUNT_ONLY_HERE";
        std::env::remove_var(name);
        assert_eq!(env_count(name, 7).unwrap(), 7);
        std::env::set_var(name, " 12 ");
        assert_eq!(env_count(name, 7).unwrap(), 12);
        std::env::set_var(name, "twelve");
        let e = env_count(name, 7).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains("twelve"), "{e}");
        std::env::remove_var(name);
    }
}
