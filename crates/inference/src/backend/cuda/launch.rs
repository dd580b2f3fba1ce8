//! Launchers: one safe method of [`CudaDevice`] per kernel of `kernels.cu` and
//! `attention.cu`, plus the dense products through cuBLAS. Shapes are checked by the callers
//! (`ops`, `attention`); here each launcher asserts the buffer sizes its kernel touches, so a
//! caller bug fails loudly instead of corrupting device memory.

use cudarc::cublas::sys as blas;
use cudarc::driver::{sys as drv, CudaFunction, CudaSlice, DevicePtrMut, LaunchConfig};

use super::paged::QkvPrep;
use super::{err, BlockRows, Buf, CudaDevice, Input};
use crate::{Error, Result};

/// A weight matrix on the device, row-major [n, k] (`nn.Linear` layout).
#[derive(Debug)]
pub enum MatrixData {
    /// f32 values.
    F32(CudaSlice<f32>),
    /// bf16 bit patterns.
    Bf16(CudaSlice<u16>),
    /// GGUF Q8_0 blocks split in two arrays: int8 codes [n, k] and f16 scales [n, k / 32]
    /// (see quant.cu).
    Q8 {
        /// The codes.
        q: CudaSlice<i8>,
        /// The f16 scale of every block of 32 codes.
        d: CudaSlice<u16>,
    },
    /// GGUF blocks of the other types (quant.rs), in runs of rows of one type each (a fused
    /// projection whose tensors have different types is several runs).
    Blocks(Vec<BlockRows>),
}

/// The query tiles of one attention launch (see `attn_paged` in attention.cu): device addresses
/// of arrays made by [`CudaDevice::input`].
#[derive(Debug)]
pub struct AttnTiles {
    /// Tiles (blocks along x).
    pub n_tiles: usize,
    /// Sequence of each tile. i32 [n_tiles]
    pub tile_seq: u64,
    /// First query row of each tile. i32 [n_tiles]
    pub tile_row0: u64,
    /// Query rows of each tile (1..=8). i32 [n_tiles]
    pub tile_n: u64,
    /// Position of each query row. i32 [rows]
    pub row_pos: u64,
    /// Page addresses of every sequence, back to back. u64 [pages]
    pub pages: u64,
    /// Index of each sequence's first page in `pages`. i32 [n_seqs]
    pub page0: u64,
}

/// Query rows per attention tile (`ATTN_ROWS` in attention.cu).
pub const ATTN_ROWS: usize = 64;

/// Keys the attention kernel stages at a time (`ATTN_KEYS` in attention.cu).
const ATTN_KEYS: usize = 32;

/// Warps of a decode attention block (`DECODE_WARPS` in attention.cu).
const DECODE_WARPS: u32 = 4;

/// Dynamic shared memory with which a decode attention block stages the first keys of each
/// warp before it waits for the kernel before it (`DECODE_STAGE_ROWS` in attention.cu): per warp,
/// key and value rows of hd elements and 16 bytes, 32 rows (16 for heads over 128 dimensions).
pub fn decode_stage_bytes(hd: usize, f16: bool) -> usize {
    let rows = if hd > 128 { 16 } else { 32 };
    let elt = if f16 { 2 } else { 4 };
    DECODE_WARPS as usize * rows * (hd * elt + 16) * 2
}

/// Head dimensions of the attention kernel variants (`attn_paged_*_d{1,2,4,8}`).
pub const ATTN_HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];

/// What the matrix-vector kernel applies to its input rows as it stages them.
#[derive(Clone, Copy)]
pub enum GemvInput<'a> {
    /// The rows as they are.
    Plain,
    /// RMSNorm of each row with this weight [k] and epsilon.
    Normed(&'a Buf, f32),
    /// SwiGLU of rows of 2k values (gate then up): the product's input is [m, k].
    Swiglu,
}

/// Tickets of split decode attention (one per (row, head) of a split launch).
pub const DECODE_TICKETS: usize = 4096;

/// Rows a matrix-vector product takes at most (`GEMV_ROWS` in kernels.cu). Measured on an
/// H200 (scripts/gpu/gemv_bench.cu): at 8 rows cuBLAS's bf16 product of a 4096 x 1024 matrix
/// takes 5 us where this kernel took 14.6 (it re-reads the staged rows for every weight), at
/// one row they are even once the fused norm is counted, so only one or two rows take it.
pub const GEMV_ROWS: usize = 2;

/// Outputs beyond which products take cuBLAS even for one row: LM heads of vocabularies up to
/// 256 Ki take this kernel. Its blocks loop over columns (one wave), so a 151,936-wide bf16 LM
/// head at batch 1 now takes it: H100, 2026-12-06, the decode step's graph 0.958-0.965 ->
/// 0.915-0.918 ms against the split + cuBLAS product + sum of halves (when each block took 8 columns, 19k
/// blocks each staging its input, it ran at 1.8 TB/s against cuBLAS's 3.7).
pub const GEMV_MAX_OUT: usize = 256 * 1024;

/// Longest bf16 rows the lean `gemv_half_bf16` takes: one pass of 32 lanes x 4 slots
/// (kernels.cu `GEMV_PF / 2`) x 8 values, which `gemv_bf16` covers with half its slots.
const GEMV_HALF_MAX_K: usize = 32 * 4 * 8;

/// Query heads of one KV head per block of the many-rows decode attention entries (attention.cu
/// `DECODE_MANY_HEADS`).
const DECODE_MANY_HEADS: usize = 2;

/// Fewest keys a decode attention block takes by default (its `min_span`): 32 per warp.
pub const DECODE_SPAN: usize = 32 * DECODE_WARPS as usize;

/// Heads a `qkv_prep` block prepares, a warp each (attention.cu `QKV_PREP_WARPS`).
const QKV_PREP_WARPS: usize = 4;

/// Values of a row each thread of `split_bf16` loads at once (kernels.cu `SPLIT_HELD`).
const SPLIT_HELD: usize = 4;

/// Shared memory the matrix-vector kernels may stage their input in (m * k f32 values).
pub const GEMV_SMEM_BYTES: usize = 96 * 1024;

/// The kernel variant (index into [`ATTN_HEAD_DIMS`]) of heads of `hd` dimensions: the
/// smallest class that holds them; heads must be a multiple of 4 and at most 256.
fn attn_variant(hd: usize) -> Result<usize> {
    match ATTN_HEAD_DIMS.iter().position(|&d| hd <= d) {
        Some(v) if hd.is_multiple_of(4) => Ok(v),
        _ => Err(Error::Device(format!(
            "cuda: attention heads of {hd} dimensions (a multiple of 4, at most 256)"
        ))),
    }
}

/// Shared memory of the attention kernel for heads of `hd`: the tile's queries, and one stage
/// of keys (rows padded by 4) and values.
pub fn attn_smem_bytes(hd: usize) -> usize {
    (ATTN_ROWS * hd + ATTN_KEYS * (hd + 4) + ATTN_KEYS * hd) * 4
}

pub(super) fn grid_1d(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(256).max(1) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn per_row(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The arguments of one kernel launch: the addresses of their values, which it borrows.
pub(super) struct Args<'a> {
    f: &'a CudaFunction,
    ptrs: Vec<*mut std::ffi::c_void>,
}

impl<'a> Args<'a> {
    /// Appends one argument (a device address or a scalar, as the kernel declares it).
    pub(super) fn arg<T: Copy>(&mut self, v: &'a T) -> &mut Self {
        self.ptrs.push(v as *const T as *mut std::ffi::c_void);
        self
    }
}

/// Threads for a kernel that walks a row of `width` values: a multiple of 32, at most 1024.
fn row_threads(width: usize) -> u32 {
    (width.div_ceil(32) * 32).clamp(32, 1024) as u32
}

impl CudaDevice {
    /// Launches `b` unless the device is replaying a recorded step (then the graph does it).
    ///
    /// # Safety
    /// As `LaunchArgs::launch`: the arguments must match the kernel and every buffer it
    /// touches must be live and large enough.
    pub(super) unsafe fn go(&self, b: &mut Args<'_>, cfg: LaunchConfig, what: &str) -> Result<()> {
        // SAFETY: the caller's guarantee.
        unsafe { self.go_clusters(b, cfg, 1, what) }
    }

    /// [`CudaDevice::go`] in clusters of `cluster` blocks along x (compute capability 9.0;
    /// 1: no clusters; the grid's x a multiple of it).
    ///
    /// # Safety
    /// As [`CudaDevice::go`].
    pub(super) unsafe fn go_clusters(
        &self,
        b: &mut Args<'_>,
        cfg: LaunchConfig,
        cluster: u32,
        what: &str,
    ) -> Result<()> {
        if self.replaying() {
            return Ok(());
        }
        if self.dependent_launch() && self.graphs.recording() {
            self.graphs.note_dependent(b.f.cu_function());
        }
        // Programmatic dependent launch (compute capability 9.0 and later): the kernel may
        // start while the one before it finishes; every kernel of the .cu files waits
        // (`DEP_ENTER`) before it touches memory that an earlier kernel writes or reads.
        let pdl = drv::CUlaunchAttribute {
            id: drv::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: drv::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let clusters = drv::CUlaunchAttribute {
            id: drv::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: drv::CUlaunchAttributeValue {
                clusterDim: drv::CUlaunchAttributeValue_union__bindgen_ty_1 {
                    x: cluster,
                    y: 1,
                    z: 1,
                },
            },
        };
        debug_assert!(cfg.grid_dim.0.is_multiple_of(cluster.max(1)));
        // The attributes in use: the dependent launch's (first), the clusters' (second).
        let mut attrs = [pdl, clusters];
        let first = usize::from(!self.dependent_launch());
        let count = u32::from(self.dependent_launch()) + u32::from(cluster > 1);
        let config = drv::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream().cu_stream(),
            attrs: attrs[first..].as_mut_ptr(),
            numAttrs: count,
        };
        // SAFETY: the caller's guarantee for the arguments; `config` and `attrs` outlive the
        // call, and `b.ptrs` points at the argument values, which `b` borrows.
        unsafe {
            drv::cuLaunchKernelEx(
                &config,
                b.f.cu_function(),
                b.ptrs.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| err(what, e))
    }

    /// The argument list of a launch of `f`.
    pub(super) fn args<'a>(&self, f: &'a CudaFunction) -> Args<'a> {
        Args {
            f,
            ptrs: Vec::with_capacity(16),
        }
    }

    pub(super) fn mptr<T>(&self, b: &mut CudaSlice<T>) -> u64 {
        let (p, _sync) = b.device_ptr_mut(self.stream());
        p
    }

    /// y [rows, dim] = RMSNorm of x with weight `w` [dim]; `y` may be `x` (pass `None`).
    pub fn rms_norm(
        &self,
        x: &mut Buf,
        w: &Buf,
        y: Option<&mut Buf>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        assert!(x.len() >= rows * dim && w.len() >= dim);
        if rows == 0 {
            return Ok(());
        }
        let px = self.mptr(x);
        let py = match y {
            Some(y) => {
                assert!(y.len() >= rows * dim);
                self.mptr(y)
            }
            None => px,
        };
        let pw = self.ptr(w);
        let dim_i = dim as i32;
        let mut b = self.args(&self.kernels().rms_norm);
        b.arg(&px).arg(&pw).arg(&py).arg(&dim_i).arg(&eps);
        // SAFETY: the kernel reads rows*dim values of x and dim of w and writes rows*dim of y,
        // all within the buffers (asserted above).
        unsafe { self.go(&mut b, per_row(rows, row_threads(dim).min(256)), "rms_norm") }
    }

    /// y [rows, dim] = RMSNorm of x with weight `w` [dim] (x unchanged).
    pub fn rms_norm_into(
        &self,
        x: &Buf,
        w: &Buf,
        y: &mut Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        assert!(x.len() >= rows * dim && w.len() >= dim && y.len() >= rows * dim);
        if rows == 0 {
            return Ok(());
        }
        let (px, pw, py) = (self.ptr(x), self.ptr(w), self.mptr(y));
        let dim_i = dim as i32;
        let mut b = self.args(&self.kernels().rms_norm);
        b.arg(&px).arg(&pw).arg(&py).arg(&dim_i).arg(&eps);
        // SAFETY: reads rows*dim values of x and dim of w, writes rows*dim of y (asserted).
        unsafe { self.go(&mut b, per_row(rows, row_threads(dim).min(256)), "rms_norm") }
    }

    /// LayerNorm of x [rows, dim] in place with weight and bias [dim].
    pub fn layer_norm(
        &self,
        x: &mut Buf,
        w: &Buf,
        bias: &Buf,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        assert!(x.len() >= rows * dim && w.len() >= dim && bias.len() >= dim);
        if rows == 0 {
            return Ok(());
        }
        let px = self.mptr(x);
        let (pw, pb) = (self.ptr(w), self.ptr(bias));
        let dim_i = dim as i32;
        let mut b = self.args(&self.kernels().layer_norm);
        b.arg(&px).arg(&pw).arg(&pb).arg(&px).arg(&dim_i).arg(&eps);
        // SAFETY: reads and writes rows*dim values of x, dim of w and bias (asserted above).
        unsafe {
            self.go(
                &mut b,
                per_row(rows, row_threads(dim).min(256)),
                "layer_norm",
            )
        }
    }

    /// Rotate-half RoPE in place over x [rows, n_heads * head_dim], row r at `positions[r]`,
    /// with `inv_freq` [half] and cos/sin scaled by `attn`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        x: &mut Buf,
        positions: &[i32],
        inv_freq: &Buf,
        n_heads: usize,
        head_dim: usize,
        attn: f32,
    ) -> Result<()> {
        let half = inv_freq.len();
        let rows = positions.len();
        assert!(x.len() >= rows * n_heads * head_dim && 2 * half <= head_dim);
        if rows == 0 {
            return Ok(());
        }
        let px = self.mptr(x);
        let pp = self.input(Input::RopePositions, positions)?;
        let pf = self.ptr(inv_freq);
        let (h, d, hf) = (n_heads as i32, head_dim as i32, half as i32);
        let mut b = self.args(&self.kernels().rope);
        b.arg(&px)
            .arg(&pp)
            .arg(&pf)
            .arg(&h)
            .arg(&d)
            .arg(&hf)
            .arg(&attn);
        // SAFETY: row r touches x[r * n_heads * head_dim ..][.. n_heads * head_dim] and reads
        // pos[r] and inv_freq[..half] (asserted above).
        unsafe {
            self.go(
                &mut b,
                per_row(rows, row_threads(n_heads * half).min(256)),
                "rope",
            )
        }
    }

    /// out [rows, width] = silu(gate) * up of gate_up [rows, 2 * width].
    pub fn silu_mul(&self, gate_up: &Buf, out: &mut Buf, rows: usize, width: usize) -> Result<()> {
        let n = rows * width;
        assert!(gate_up.len() >= 2 * n && out.len() >= n);
        let (pg, po) = (self.ptr(gate_up), self.mptr(out));
        let (w, n64) = (width as i32, n as i64);
        let mut b = self.args(&self.kernels().silu_mul);
        b.arg(&pg).arg(&po).arg(&w).arg(&n64);
        // SAFETY: thread i < n reads gate_up[(i / width) * 2 * width ..] and writes out[i].
        unsafe { self.go(&mut b, grid_1d(n), "silu_mul") }
    }

    /// Exact GELU of the first `n` values of x, in place.
    pub fn gelu(&self, x: &mut Buf, n: usize) -> Result<()> {
        assert!(x.len() >= n);
        let px = self.mptr(x);
        let n64 = n as i64;
        let mut b = self.args(&self.kernels().gelu);
        b.arg(&px).arg(&n64);
        // SAFETY: thread i < n touches x[i].
        unsafe { self.go(&mut b, grid_1d(n), "gelu") }
    }

    /// y [rows, width] += bias [width] on every row.
    pub fn add_bias(&self, y: &mut Buf, bias: &Buf, rows: usize, width: usize) -> Result<()> {
        let n = rows * width;
        assert!(y.len() >= n && bias.len() >= width);
        let (py, pb) = (self.mptr(y), self.ptr(bias));
        let (w, n64) = (width as i32, n as i64);
        let mut b = self.args(&self.kernels().add_bias);
        b.arg(&py).arg(&pb).arg(&w).arg(&n64);
        // SAFETY: thread i < n touches y[i] and bias[i % width].
        unsafe { self.go(&mut b, grid_1d(n), "add_bias") }
    }

    /// The kernel arguments of `input` for m rows of k (norm weight address or 0, epsilon,
    /// SwiGLU flag), after checking that x holds the rows (2k values each for SwiGLU).
    pub(super) fn input_args(
        &self,
        input: GemvInput<'_>,
        x: &Buf,
        m: usize,
        k: usize,
    ) -> (u64, f32, i32) {
        let (x_len, args) = match input {
            GemvInput::Plain => (m * k, (0u64, 0.0f32, 0i32)),
            GemvInput::Normed(nw, eps) => {
                assert!(nw.len() >= k);
                (m * k, (self.ptr(nw), eps, 0))
            }
            GemvInput::Swiglu => (2 * m * k, (0, 0.0, 1)),
        };
        assert!(x.len() >= x_len);
        args
    }

    /// The m input rows of a product as two bf16 halves [hi; lo] ([2m, k], see `split_bf16`
    /// in kernels.cu), `input` applied to them first: hi + lo holds 16 significant bits. (The
    /// 2mk bf16 values in mk f32-sized slots: a Buf, so that recordings take it from their pool.)
    fn split_bf16(&self, x: &Buf, m: usize, k: usize, input: GemvInput<'_>) -> Result<Buf> {
        let (pn, eps, sw) = self.input_args(input, x, m, k);
        let mut hl = self.alloc_buf(m * k)?;
        let (px, ph) = (self.ptr(x), self.mptr(&mut hl));
        let ki = k as i32;
        let mut b = self.args(&self.kernels().split_bf16);
        b.arg(&px).arg(&ph).arg(&ki).arg(&pn).arg(&eps).arg(&sw);
        let threads = row_threads(k.div_ceil(SPLIT_HELD));
        // SAFETY: block r reads row r of x (k or 2k values; checked by input_args) and k of the norm
        // weight, and writes hl[r k ..] and hl[m k + r k ..] (hl holds 2mk).
        unsafe { self.go(&mut b, per_row(m, threads), "split_bf16") }?;
        Ok(hl)
    }

    /// Columns `col0 .. col0 + width` of x [rows, ld], as a new [rows, width] buffer.
    pub fn copy_cols(
        &self,
        x: &Buf,
        ld: usize,
        col0: usize,
        rows: usize,
        width: usize,
    ) -> Result<Buf> {
        let mut y = self.alloc_buf(rows * width)?;
        self.copy_cols_into(x, ld, col0, rows, width, &mut y, 0)?;
        Ok(y)
    }

    /// [`CudaDevice::copy_cols`] into y [rows, width] starting `y_off` values into `y`.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_cols_into(
        &self,
        x: &Buf,
        ld: usize,
        col0: usize,
        rows: usize,
        width: usize,
        y: &mut Buf,
        y_off: usize,
    ) -> Result<()> {
        assert!(col0 + width <= ld && x.len() >= rows * ld);
        let n = rows * width;
        assert!(y.len() >= y_off + n);
        let (px, py) = (self.ptr(x), self.mptr(y) + y_off as u64 * 4);
        let (ld_i, c0, w, n64) = (ld as i32, col0 as i32, width as i32, n as i64);
        let mut b = self.args(&self.kernels().copy_cols);
        b.arg(&px).arg(&ld_i).arg(&c0).arg(&py).arg(&w).arg(&n64);
        // SAFETY: thread i < n reads x[(i / width) * ld + col0 + i % width] < rows * ld and
        // writes y[y_off + i] (asserted in bounds).
        unsafe { self.go(&mut b, grid_1d(n), "copy_cols") }
    }

    /// Rows `idx` of x [src_rows, width], as a new [idx.len(), width] buffer.
    pub fn gather_rows(&self, x: &Buf, src_rows: usize, idx: &[u32], width: usize) -> Result<Buf> {
        assert!(idx.iter().all(|&r| (r as usize) < src_rows) && x.len() >= src_rows * width);
        let mut y = self.alloc_buf(idx.len() * width)?;
        if idx.is_empty() {
            return Ok(y);
        }
        let pi = self.input(Input::RowIndices, idx)?;
        let (px, py) = (self.ptr(x), self.mptr(&mut y));
        let w = width as i32;
        let mut b = self.args(&self.kernels().gather_rows);
        b.arg(&px).arg(&pi).arg(&py).arg(&w);
        // SAFETY: block r copies row idx[r] < src_rows of x into row r of y.
        unsafe {
            self.go(
                &mut b,
                per_row(idx.len(), row_threads(width).min(256)),
                "gather_rows",
            )
        }?;
        Ok(y)
    }

    /// Rows `ids` of an f32 table [vocab, dim].
    pub fn embed_f32(&self, table: &Buf, vocab: usize, ids: &[u32], dim: usize) -> Result<Buf> {
        assert!(ids.iter().all(|&i| (i as usize) < vocab) && table.len() >= vocab * dim);
        let mut y = self.alloc_buf(ids.len() * dim)?;
        if ids.is_empty() {
            return Ok(y);
        }
        let pi = self.input(Input::TokenIds, ids)?;
        let (pt, py) = (self.ptr(table), self.mptr(&mut y));
        let d = dim as i32;
        let mut b = self.args(&self.kernels().embed_f32);
        b.arg(&pt).arg(&pi).arg(&py).arg(&d);
        // SAFETY: block r copies table row ids[r] < vocab into row r of y.
        unsafe {
            self.go(
                &mut b,
                per_row(ids.len(), row_threads(dim).min(256)),
                "embed_f32",
            )
        }?;
        Ok(y)
    }

    /// The index of the largest value of each row of x [rows, n] (the first on ties). While a
    /// step is recorded or replayed the ids are written to the device's output and zeros are
    /// returned; [`CudaDevice::graph_step`] reads the output once the graph has run.
    pub fn argmax_rows(&self, x: &Buf, rows: usize, n: usize) -> Result<Vec<u32>> {
        assert!(x.len() >= rows * n && n > 0);
        if rows == 0 {
            return Ok(Vec::new());
        }
        let po = self.output(rows)?;
        if self.replaying() {
            return Ok(vec![0; rows]); // the recording writes the output
        }
        let px = self.ptr(x);
        let n_i = n as i32;
        // Stage 1: slices of 2,048 values or more per block, enough blocks to fill the GPU.
        let slices = n
            .div_ceil(2048)
            .min((2 * self.sm_count()).div_ceil(rows))
            .max(1);
        let mut part_v = self.alloc_buf(rows * slices)?;
        // (i32 indices in f32-sized slots: a Buf, so that recordings take it from their pool.)
        let mut part_i = self.alloc_buf(rows * slices)?;
        let (pv, pi) = (self.mptr(&mut part_v), self.mptr(&mut part_i));
        let mut b = self.args(&self.kernels().argmax_part);
        b.arg(&px).arg(&pv).arg(&pi).arg(&n_i);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, slices as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (r, b) reads slice b of row r of x and writes part entry (r, b).
        unsafe { self.go(&mut b, cfg, "argmax_part") }?;
        let nb = slices as i32;
        let mut b = self.args(&self.kernels().argmax_merge);
        b.arg(&pv).arg(&pi).arg(&po).arg(&nb);
        let threads = (slices.div_ceil(32) * 32).min(1024) as u32;
        // SAFETY: block r reads row r's parts and writes output[r] (the output holds `rows`).
        unsafe { self.go(&mut b, per_row(rows, threads), "argmax_merge") }?;
        drop((part_v, part_i));
        if self.graph_mode() {
            return Ok(vec![0; rows]);
        }
        self.read_output(rows)
    }

    /// Writes row r of k and v [rows, kv_dim] to the page row at `dst[r]` (the address of the
    /// row in attention slot 0): keys `k_off` elements further, values `k_off + val_off`; f32,
    /// or (with `f16`) f16.
    ///
    /// # Safety
    /// Every address in `dst` plus those offsets must point at `kv_dim` writable values of a
    /// live page.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn kv_write(
        &self,
        k: &Buf,
        v: &Buf,
        dst: &[u64],
        kv_dim: usize,
        k_off: usize,
        val_off: usize,
        f16: bool,
    ) -> Result<()> {
        let rows = dst.len();
        assert!(k.len() >= rows * kv_dim && v.len() >= rows * kv_dim);
        if rows == 0 {
            return Ok(());
        }
        let f = if f16 {
            &self.kernels().kv_write_f16
        } else {
            &self.kernels().kv_write_f32
        };
        let pd = self.input(Input::KvDst, dst)?;
        let (pk, pv) = (self.ptr(k), self.ptr(v));
        let (d, ko, vo) = (kv_dim as i32, k_off as i64, val_off as i64);
        let mut b = self.args(f);
        b.arg(&pk).arg(&pv).arg(&pd).arg(&d).arg(&ko).arg(&vo);
        // SAFETY: the caller guarantees the destinations; sources are asserted above.
        unsafe {
            self.go(
                &mut b,
                per_row(rows, row_threads(kv_dim).min(256)),
                "kv_write",
            )
        }
    }

    /// Causal attention of q [rows, n_heads * hd] over paged keys and values (see
    /// `attn_paged` in attention.cu); returns the context [rows, n_heads * hd].
    ///
    /// # Safety
    /// `tiles.pages` must hold the addresses of live pages that contain every key and value
    /// row the tiles' positions reach, laid out as `k_off`, `val_off` and `page_rows` say.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention(
        &self,
        q: &Buf,
        rows: usize,
        tiles: &AttnTiles,
        page_rows: usize,
        k_off: usize,
        val_off: usize,
        n_heads: usize,
        n_kv_heads: usize,
        hd: usize,
        scale: f32,
        window: Option<usize>,
        f16: bool,
    ) -> Result<Buf> {
        assert!(n_heads.is_multiple_of(n_kv_heads) && q.len() >= rows * n_heads * hd);
        let variant = attn_variant(hd)?;
        let smem = attn_smem_bytes(ATTN_HEAD_DIMS[variant]);
        if smem > self.max_smem() {
            return Err(Error::Device(format!(
                "cuda: attention heads of {hd} dimensions need {} KiB of shared memory per block; {} has {} KiB",
                smem / 1024,
                self.name(),
                self.max_smem() / 1024
            )));
        }
        let mut out = self.alloc_buf(rows * n_heads * hd)?;
        if rows == 0 || tiles.n_tiles == 0 {
            return Ok(out);
        }
        let f = if f16 {
            &self.kernels().attn_paged_f16[variant]
        } else {
            &self.kernels().attn_paged_f32[variant]
        };
        let smem = smem as u32;
        let (pq, po) = (self.ptr(q), self.mptr(&mut out));
        let (ts, tr, tn, rp, pg, p0) = (
            tiles.tile_seq,
            tiles.tile_row0,
            tiles.tile_n,
            tiles.row_pos,
            tiles.pages,
            tiles.page0,
        );
        let (pr, ko, vo) = (page_rows as i32, k_off as i64, val_off as i64);
        let (h, kvh, d) = (n_heads as i32, n_kv_heads as i32, hd as i32);
        let win = window.map_or(0, |w| w.clamp(1, i32::MAX as usize) as i32);
        let mut b = self.args(f);
        b.arg(&pq)
            .arg(&po)
            .arg(&ts)
            .arg(&tr)
            .arg(&tn)
            .arg(&rp)
            .arg(&pg)
            .arg(&p0)
            .arg(&pr)
            .arg(&ko)
            .arg(&vo)
            .arg(&h)
            .arg(&kvh)
            .arg(&d)
            .arg(&scale)
            .arg(&win);
        let cfg = LaunchConfig {
            grid_dim: (tiles.n_tiles as u32, n_heads as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the caller guarantees the pages; q, out and the tile arrays are sized by
        // the asserts above and by `AttnTiles`' construction.
        unsafe { self.go(&mut b, cfg, "attention") }?;
        Ok(out)
    }

    /// The fused attention input of a layer (see `qkv_prep` in attention.cu): returns the
    /// queries [rows, n_heads * hd] and writes the keys and values into the pages at `dst`.
    ///
    /// # Safety
    /// As [`CudaDevice::kv_write`] for `dst`, `k_off` and `val_off`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn qkv_prep(
        &self,
        qkv: &Buf,
        dst: &[u64],
        prep: &QkvPrep<'_>,
        n_heads: usize,
        n_kv_heads: usize,
        hd: usize,
        k_off: usize,
        val_off: usize,
        f16: bool,
    ) -> Result<Buf> {
        let rows = dst.len();
        assert!(qkv.len() >= rows * (n_heads + 2 * n_kv_heads) * hd);
        let mut q = self.alloc_buf(rows * n_heads * hd)?;
        if rows == 0 {
            return Ok(q);
        }
        let f = if f16 {
            &self.kernels().qkv_prep_f16
        } else {
            &self.kernels().qkv_prep_f32
        };
        let half = prep.inv_freq.len();
        assert!(hd <= 256 && 2 * half <= hd && prep.positions.len() == rows);
        let (qw, kw, eps) = match prep.norms {
            Some((qn, kn, eps)) => {
                assert!(qn.len() >= hd && kn.len() >= hd);
                (self.ptr(qn), self.ptr(kn), eps)
            }
            None => (0u64, 0u64, 0.0f32),
        };
        let pd = self.input(Input::KvDst, dst)?;
        let pp = self.input(Input::RopePositions, prep.positions)?;
        let (px, pq, pf) = (self.ptr(qkv), self.mptr(&mut q), self.ptr(prep.inv_freq));
        let (hf, h, kvh, d) = (half as i32, n_heads as i32, n_kv_heads as i32, hd as i32);
        let (ko, vo) = (k_off as i64, val_off as i64);
        let mut b = self.args(f);
        b.arg(&px)
            .arg(&pq)
            .arg(&pd)
            .arg(&pp)
            .arg(&pf)
            .arg(&hf)
            .arg(&prep.attn)
            .arg(&qw)
            .arg(&kw)
            .arg(&eps)
            .arg(&h)
            .arg(&kvh)
            .arg(&d)
            .arg(&ko)
            .arg(&vo);
        let cfg = LaunchConfig {
            grid_dim: (
                rows as u32,
                (n_heads + 2 * n_kv_heads).div_ceil(QKV_PREP_WARPS) as u32,
                1,
            ),
            block_dim: (32 * QKV_PREP_WARPS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (r, h) reads head h of qkv row r (sized above) and writes query row r
        // of q or the key / value row at dst[r] (the caller's guarantee).
        unsafe { self.go(&mut b, cfg, "qkv_prep") }?;
        Ok(q)
    }

    /// Decode attention: query row r of q [rows, n_heads * hd] is sequence r's one new row (see
    /// `attn_decode` in attention.cu; hd a multiple of 4, at most 256); `tiles` as for
    /// [`CudaDevice::attention`] (only its positions and pages are read).
    ///
    /// # Safety
    /// As [`CudaDevice::attention`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn attention_decode(
        &self,
        q: &Buf,
        rows: usize,
        tiles: &AttnTiles,
        page_rows: usize,
        k_off: usize,
        val_off: usize,
        n_heads: usize,
        n_kv_heads: usize,
        hd: usize,
        scale: f32,
        window: Option<usize>,
        f16: bool,
    ) -> Result<Buf> {
        assert!(hd <= 256 && hd.is_multiple_of(4) && n_heads.is_multiple_of(n_kv_heads));
        assert!(q.len() >= rows * n_heads * hd);
        let mut out = self.alloc_buf(rows * n_heads * hd)?;
        if rows == 0 {
            return Ok(out);
        }
        let variant = attn_variant(hd)?;
        // More (row, head) pairs than two blocks per SM, of query heads sharing KV heads: the
        // entries taking DECODE_MANY_HEADS query heads of one KV head per block, reading each
        // key and value row once for them.
        let group = n_heads / n_kv_heads;
        let many = rows * n_heads > 2 * self.sm_count() && group > 1;
        let head_blocks = n_kv_heads * group.div_ceil(if many { DECODE_MANY_HEADS } else { 1 });
        let k = self.kernels();
        let f = match (f16, many) {
            (true, false) => &k.attn_decode_f16[variant],
            (false, false) => &k.attn_decode_f32[variant],
            (true, true) => &k.attn_decode_many_f16[variant],
            (false, true) => &k.attn_decode_many_f32[variant],
        };
        let (pq, po) = (self.ptr(q), self.mptr(&mut out));
        let (rp, pg, p0) = (tiles.row_pos, tiles.pages, tiles.page0);
        let (pr, ko, vo) = (page_rows as i32, k_off as i64, val_off as i64);
        let (h, kvh, d) = (n_heads as i32, n_kv_heads as i32, hd as i32);
        let win = window.map_or(0, |w| w.clamp(1, i32::MAX as usize) as i32);
        // Few (row, head) blocks leave most of the GPU idle: split each row's keys over
        // enough blocks to fill it twice (flash-decoding), merged by the last of them to finish.
        let splits = (2 * self.sm_count()).div_ceil(rows * n_heads).clamp(1, 32);
        let mut part = self.alloc_buf(if splits > 1 {
            rows * n_heads * splits * (hd + 2)
        } else {
            1
        })?;
        let (sp, pp) = (splits as i32, self.mptr(&mut part));
        let min_span = self.decode_span() as i32;
        // Split launches have fewer (row, head) pairs than 2 SMs' worth, so the tickets fit.
        assert!(splits == 1 || rows * n_heads <= DECODE_TICKETS);
        let pt = self.ptr(&self.decode_tickets);
        let mut b = self.args(f);
        b.arg(&pq)
            .arg(&po)
            .arg(&rp)
            .arg(&pg)
            .arg(&p0)
            .arg(&pr)
            .arg(&ko)
            .arg(&vo)
            .arg(&h)
            .arg(&kvh)
            .arg(&d)
            .arg(&scale)
            .arg(&win)
            .arg(&sp)
            .arg(&pp)
            .arg(&pt)
            .arg(&min_span);
        // Launches of at most one (row, head) pair per SM stage their first keys ahead (one
        // block per SM then fits; larger launches keep two or three resident instead), when
        // rows copy in 16-byte pieces. The kernel's shared memory was raised for its class's
        // widest heads where they fit.
        let stage = decode_stage_bytes(hd, f16);
        let staged = rows * n_heads <= self.sm_count()
            && (hd * if f16 { 2 } else { 4 }).is_multiple_of(16)
            && decode_stage_bytes(ATTN_HEAD_DIMS[variant], f16) <= self.decode_stage_limit();
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, head_blocks as u32, splits as u32),
            block_dim: (32 * DECODE_WARPS, 1, 1),
            shared_mem_bytes: if staged { stage as u32 } else { 0 },
        };
        // SAFETY: the caller guarantees the pages; q, out and part are sized above (block
        // (r, y, z) writes part's (r, h, z) entries of hd + 2 values for its heads h, at most
        // DECODE_MANY_HEADS of KV head y's group, and the last of (r, y)'s blocks, or the only
        // one, out's row r at those heads); ticket r * n_heads + h exists (asserted).
        unsafe { self.go(&mut b, cfg, "attention_decode") }?;
        drop(part);
        Ok(out)
    }

    /// y [m, n] = x [m, k] · Wᵀ with W [n, k] (f32 sums; bf16 weights multiply the f32
    /// activations, exactly in the matrix-vector kernel and through a two-term bf16 split of
    /// them in cuBLAS), or y += that with `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        x: &Buf,
        m: usize,
        w: &MatrixData,
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
    ) -> Result<()> {
        assert!(x.len() >= m * k && y.len() >= m * n);
        if m == 0 || n == 0 {
            return Ok(());
        }
        self.matmul_in(x, m, w, n, k, y, accumulate, GemvInput::Plain)
    }

    /// [`CudaDevice::matmul`] of `input` applied to the rows of x (RMSNorm, or SwiGLU of rows
    /// of 2k values) inside the product's kernels: the matrix-vector kernel's staging, or the
    /// bf16 split of cuBLAS's input. f32 weights in cuBLAS take `Plain` only ([`fuses`]).
    ///
    /// [`fuses`]: CudaDevice::fuses
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_in(
        &self,
        x: &Buf,
        m: usize,
        w: &MatrixData,
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        input: GemvInput<'_>,
    ) -> Result<()> {
        assert!(y.len() >= m * n);
        if m == 0 || n == 0 {
            return Ok(());
        }
        match w {
            MatrixData::Q8 { q, d } => {
                return self.matmul_q8(x, m, (q, d), n, k, y, accumulate, input)
            }
            MatrixData::Blocks(parts) => {
                return self.matmul_blocks(x, m, parts, n, k, y, accumulate, input)
            }
            MatrixData::F32(_) | MatrixData::Bf16(_) => {}
        }
        if self.gemv_fits(m, n, k) {
            return self.gemv(x, m, w, n, k, y, accumulate, input);
        }
        assert!(
            matches!(input, GemvInput::Plain) || matches!(w, MatrixData::Bf16(_)),
            "f32 products in cuBLAS take their input as it is"
        );
        if self.replaying() {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0f32 });
        let py = self.mptr(y);
        let _guard = self.blas_lock.lock();
        let h = *self.blas.handle();
        // Row-major y [m, n] is column-major yᵀ [n, m] = W [n, k] (column-major Wᵀ [k, n],
        // transposed) times xᵀ [k, m].
        let (mi, ni, ki) = (n as i32, m as i32, k as i32);
        let t = blas::cublasOperation_t::CUBLAS_OP_T;
        let nt = blas::cublasOperation_t::CUBLAS_OP_N;
        match w {
            MatrixData::Q8 { .. } | MatrixData::Blocks(_) => {
                unreachable!("quantized products returned above")
            }
            MatrixData::F32(wb) => {
                assert!(wb.len() >= n * k);
                let (pw, px) = (self.ptr(wb), self.ptr(x));
                // SAFETY: W holds n*k, x m*k and y m*n values (asserted); the handle is
                // bound to this device's stream and used under the lock.
                unsafe {
                    cudarc::cublas::result::sgemm(
                        h,
                        t,
                        nt,
                        mi,
                        ni,
                        ki,
                        &alpha,
                        pw as *const f32,
                        ki,
                        px as *const f32,
                        ki,
                        &beta,
                        py as *mut f32,
                        mi,
                    )
                }
                .map_err(|e| err("sgemm", e))
            }
            MatrixData::Bf16(wb) => {
                // The activations as two bf16 halves stacked [hi; lo] (2m rows): one product
                // reads the weights once, and the halves' sums add to within ~2^-17 of the f32
                // product (tensor cores take bf16 operands only).
                assert!(wb.len() >= n * k);
                let hl = self.split_bf16(x, m, k, input)?;
                let mut y2 = self.alloc_buf(2 * m * n)?;
                let (pw, px, py2) = (self.ptr(wb), self.ptr(&hl), self.mptr(&mut y2));
                let zero = 0.0f32;
                // SAFETY: as above, with bf16 operands W [n, k] and hl [2m, k] (2mk values) and
                // the f32 output y2 [2m, n].
                unsafe {
                    cudarc::cublas::result::gemm_ex(
                        h,
                        t,
                        nt,
                        mi,
                        2 * ni,
                        ki,
                        (&alpha as *const f32).cast(),
                        pw as *const _,
                        blas::cudaDataType_t::CUDA_R_16BF,
                        ki,
                        px as *const _,
                        blas::cudaDataType_t::CUDA_R_16BF,
                        ki,
                        (&zero as *const f32).cast(),
                        py2 as *mut _,
                        blas::cudaDataType_t::CUDA_R_32F,
                        mi,
                        blas::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        blas::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                    )
                }
                .map_err(|e| err("gemm_ex bf16", e))?;
                drop(_guard);
                let (mn, acc) = ((m * n) as i64, i32::from(accumulate));
                let mut b = self.args(&self.kernels().add_halves);
                b.arg(&py2).arg(&py).arg(&mn).arg(&acc);
                // SAFETY: thread i < mn reads y2[i] and y2[mn + i] (2mn values) and writes y[i]
                // (y holds m*n, asserted).
                unsafe { self.go(&mut b, grid_1d(m * n), "add_halves") }
            }
        }
    }

    /// Whether [`CudaDevice::matmul_in`] applies an input mode inside a product of m rows of k
    /// into n outputs with weights `w`.
    pub fn fuses(&self, m: usize, n: usize, k: usize, w: &MatrixData) -> bool {
        self.gemv_fits(m, n, k)
            || matches!(
                w,
                MatrixData::Bf16(_) | MatrixData::Q8 { .. } | MatrixData::Blocks(_)
            )
    }

    /// Whether a product of m rows of k takes the matrix-vector kernel.
    pub fn gemv_fits(&self, m: usize, n: usize, k: usize) -> bool {
        m <= GEMV_ROWS
            && n <= self.gemv_max_out
            && k.is_multiple_of(8)
            && m * k * 4 <= GEMV_SMEM_BYTES.min(self.max_smem())
    }

    /// The matrix-vector kernel for bf16 rows of k. With `LATTICE_CUDA_GEMV_LEAN=1`, the
    /// register-lean entries (kernels.cu `gemv_half_bf16`, `gemv_capped_bf16`): the same loads
    /// and sums in fewer registers, so that the next kernel's blocks fit beside a product's two
    /// blocks per SM and start early (the whole-share entry of F1, 2026-12-07, filled the
    /// register file and made every launch of an H100 step slower). Off until measured.
    fn gemv_bf16_entry(&self, k: usize) -> &CudaFunction {
        let kernels = self.kernels();
        if !self.gemv_lean {
            &kernels.gemv_bf16
        } else if k <= GEMV_HALF_MAX_K {
            &kernels.gemv_half_bf16
        } else {
            &kernels.gemv_capped_bf16
        }
    }

    /// [`CudaDevice::matmul`] for m <= GEMV_ROWS rows and k a multiple of 8 ([`gemv_fits`]):
    /// one warp per output column streaming W once (decode is bound by reading the weights),
    /// with `input` applied to the rows as they are staged.
    ///
    /// [`gemv_fits`]: CudaDevice::gemv_fits
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        x: &Buf,
        m: usize,
        w: &MatrixData,
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        input: GemvInput<'_>,
    ) -> Result<()> {
        assert!(self.gemv_fits(m, n, k) && y.len() >= m * n);
        let (pn, eps, sw) = self.input_args(input, x, m, k);
        let (f, pw) = match w {
            MatrixData::F32(b) => {
                assert!(b.len() >= n * k);
                (&self.kernels().gemv_f32, self.ptr(b))
            }
            MatrixData::Bf16(b) => {
                assert!(b.len() >= n * k);
                (self.gemv_bf16_entry(k), self.ptr(b))
            }
            MatrixData::Q8 { q, d } => {
                return self.matmul_q8(x, m, (q, d), n, k, y, accumulate, input);
            }
            MatrixData::Blocks(parts) => {
                return self.matmul_blocks(x, m, parts, n, k, y, accumulate, input);
            }
        };
        let (px, py) = (self.ptr(x), self.mptr(y));
        let (mi, ni, ki, acc) = (m as i32, n as i32, k as i32, i32::from(accumulate));
        let mut b = self.args(f);
        b.arg(&px)
            .arg(&pw)
            .arg(&py)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&acc)
            .arg(&pn)
            .arg(&eps)
            .arg(&sw);
        let cfg = LaunchConfig {
            grid_dim: (self.gemv_blocks(n) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (m * k * 4) as u32,
        };
        // SAFETY: x holds the rows input_args checked, W n*k (16-byte aligned rows: k is a
        // multiple of 8 and device allocations are 256-byte aligned), y m*n; warp `col < n`
        // writes y[j * n + col] for j < m.
        unsafe { self.go(&mut b, cfg, "gemv") }
    }
}
