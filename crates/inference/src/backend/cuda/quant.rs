//! GGUF quantized products on the device (kernels in quant.cu).
//!
//! - Q8_0: a matrix is uploaded as int8 codes and f16 scales; a product quantizes its input
//!   rows per block of 32 as the CPU backend does (with the input's RMSNorm or SwiGLU fused),
//!   then multiplies with integer dot products: `gemv_q8`, which quantizes its rows itself, for
//!   up to 8 rows (decode); for more, the tiled kernel of the block types below (the two arrays
//!   are exactly the Q8_0 block type's bodies and scales).
//! - Q4_0, Q4_1, Q5_0, Q4_K, Q6_K (and Q8_0 beside them in one fused matrix): [`BlockRows`],
//!   the file's blocks with their f16 scales split off (so the rest is 4-byte aligned); the
//!   activations quantized as the CPU quantizes them for that type (Q8_0, Q8_1 or Q8_K); one
//!   matrix-vector kernel per type for up to 8 rows (quantizing them itself), a tiled kernel
//!   on the int8 tensor cores after a quantizing pass for more (`LATTICE_CUDA_QUANT=gemv`
//!   keeps the matrix-vector kernel, in groups of 8 rows, for every product: an A/B switch).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::launch::{per_row, GemvInput, MatrixData, GEMV_SMEM_BYTES};
use super::{Buf, CudaDevice};
use crate::quant::QuantType;
use crate::{Error, Result};

/// Rows one block of the Q8_0 matrix-vector kernel takes (`Q8_GEMV_ROWS` in quant.cu).
const Q8_GEMV_ROWS: usize = 8;

/// Rows up to which products take the matrix-vector kernel (it can take groups of 8 rows side
/// by side, each streaming the weights, but at 64 rows that measured 3,448 tokens/s against
/// 4,669 for the tiled kernel on an H200): more rows take the tiled kernel.
const Q8_GEMV_MAX: usize = Q8_GEMV_ROWS;

/// Bytes of a GGUF Q8_0 block: an f16 scale, then 32 codes.
const BLOCK_BYTES: usize = 34;

/// The device form of a GGUF Q8_0 matrix of `n` rows of `k` values (`gguf`: its blocks,
/// row-major, as in the file).
pub fn q8_matrix(dev: &CudaDevice, gguf: &[u8], n: usize, k: usize) -> Result<MatrixData> {
    if !k.is_multiple_of(32) || gguf.len() != n * (k / 32) * BLOCK_BYTES {
        return Err(Error::Device(format!(
            "cuda: a Q8_0 matrix of {n} x {k} needs k a multiple of 32 and {} bytes, got {}",
            n * (k / 32) * BLOCK_BYTES,
            gguf.len()
        )));
    }
    let mut q = Vec::with_capacity(n * k);
    let mut d = Vec::with_capacity(n * k / 32);
    for block in gguf.chunks_exact(BLOCK_BYTES) {
        d.push(u16::from_le_bytes([block[0], block[1]]));
        q.extend(block[2..].iter().map(|&b| b as i8));
    }
    Ok(MatrixData::Q8 {
        q: dev.upload(&q)?,
        d: dev.upload(&d)?,
    })
}

impl CudaDevice {
    /// [`CudaDevice::matmul_in`] with Q8_0 weights (codes `q` [n, k], scales `d`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_q8(
        &self,
        x: &Buf,
        m: usize,
        (q, d): (&CudaSlice<i8>, &CudaSlice<u16>),
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        input: GemvInput<'_>,
    ) -> Result<()> {
        assert!(
            k.is_multiple_of(32) && q.len() >= n * k && d.len() >= n * k / 32 && y.len() >= m * n
        );
        let (pn, eps, sw) = self.input_args(input, x, m, k);
        let smem = Q8_GEMV_ROWS.min(m) * k * 9 / 8;
        if m <= Q8_GEMV_MAX && !q8_as_blocks() && smem <= GEMV_SMEM_BYTES.min(self.max_smem()) {
            // One launch: every block quantizes its group of rows itself.
            let (pw, pwd, py) = (self.ptr(q), self.ptr(d), self.mptr(y));
            let (mi, ni, ki, acc) = (m as i32, n as i32, k as i32, i32::from(accumulate));
            let px = self.ptr(x);
            let mut b = self.args(&self.kernels().gemv_q8);
            b.arg(&px)
                .arg(&pw)
                .arg(&pwd)
                .arg(&py)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki)
                .arg(&acc)
                .arg(&pn)
                .arg(&eps)
                .arg(&sw);
            let cfg = LaunchConfig {
                grid_dim: (
                    self.gemv_blocks(n) as u32,
                    m.div_ceil(Q8_GEMV_ROWS) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            // SAFETY: block (bx, g) reads rows 8g .. 8g + 8 of x (k or 2k values each, checked
            // by input_args; fewer in the last group) and k of the norm weight, n k codes of q
            // and n k / 32 scales of d (asserted), and writes y[r n + c] for its rows r < m and
            // columns c < n (y holds m n); its shared memory holds 8 rows of 9k / 8 bytes.
            return unsafe { self.go(&mut b, cfg, "gemv_q8") };
        }
        // The same arrays are the Q8_0 block type's bodies (32 codes) and scales.
        let part = PartArgs {
            kernel: Q8_0_KERNEL,
            per256: false,
            w: (self.ptr(q), self.ptr(d)),
            rows: n,
        };
        let input = (pn, eps, sw);
        if m <= BLOCK_GROUP_ROWS {
            self.gemv_blocks_part(x, m, part, 0, n, k, y, accumulate, input)
        } else {
            self.gemm_blocks(x, m, &[part], n, k, y, accumulate, input)
        }
    }
}

/// How a block type is held on the device: its kernel (index into `Kernels::gemv_blocks`, the
/// `T_*` number in quant.cu), and the byte offsets of its f16 scales in a GGUF block (the other
/// bytes, in order, are the body the kernel reads).
fn block_layout(t: QuantType) -> Option<(usize, &'static [usize])> {
    Some(match t {
        QuantType::Q4_0 => (0, &[0]),
        QuantType::Q4_1 => (1, &[0, 2]),
        QuantType::Q5_0 => (2, &[0]),
        QuantType::Q4_K => (3, &[0, 2]),
        QuantType::Q6_K => (4, &[208]),
        QuantType::Q8_0 => (Q8_0_KERNEL, &[0]),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => return None,
    })
}

/// Rows per group of the block kernels (the kernel's `rows_per_block`, at most 8); products
/// of more rows take the tiled kernel.
const BLOCK_GROUP_ROWS: usize = 8;

/// Rows and columns of a tile of the block types' tiled kernel (`BLK_TILE` in quant.cu).
const BLOCK_TILE: usize = 64;

/// The block kernels' index of Q8_0 (see [`block_layout`]).
const Q8_0_KERNEL: usize = 5;

/// `LATTICE_CUDA_Q8=blocks`: Q8_0 matrices' products of up to 8 rows through the block types'
/// matrix-vector kernel (loads issued ahead) instead of `gemv_q8`: an A/B switch (calls
/// 6.2 / 6.4 on the H200: tg 562 / 604 against 617 / 597 tokens/s).
fn q8_as_blocks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_Q8").is_ok_and(|v| v == "blocks"))
}

/// `LATTICE_CUDA_QUANT=gemv`: the matrix-vector kernel for products of any number of rows.
fn gemv_only() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LATTICE_CUDA_QUANT").is_ok_and(|v| v == "gemv"))
}

/// One run of block rows as a launch takes it: the kernel index, whether its activations are
/// quantized per 256 (Q8_K) rather than per 32, its bodies' and scales' device addresses
/// (sizes checked), and its rows.
#[derive(Clone, Copy)]
struct PartArgs {
    kernel: usize,
    per256: bool,
    w: (u64, u64),
    rows: usize,
}

/// A run of rows of a GGUF matrix of one block type, on the device: every block's f16 scales
/// (`halves`) split from the rest of its bytes (`body`), in the file's order.
#[derive(Debug)]
pub struct BlockRows {
    qtype: QuantType,
    kernel: usize,
    rows: usize,
    body: CudaSlice<u8>,
    halves: CudaSlice<u16>,
}

impl BlockRows {
    /// The device form of `n` rows of `k` values of type `t` (`gguf`: the rows' blocks as in
    /// the file); float types are refused.
    pub fn new(dev: &CudaDevice, t: QuantType, gguf: &[u8], n: usize, k: usize) -> Result<Self> {
        let (kernel, at) = block_layout(t)
            .ok_or_else(|| Error::Device(format!("cuda: {} is not a block type", t.name())))?;
        let bb = t.block_bytes();
        match t.row_bytes(k) {
            Some(rb) if rb * n == gguf.len() => {}
            _ => {
                return Err(Error::Device(format!(
                    "cuda: a {} matrix of {n} x {k} needs k a multiple of {} and {} bytes, got {}",
                    t.name(),
                    t.block_len(),
                    t.row_bytes(k).map_or(0, |rb| rb * n),
                    gguf.len()
                )))
            }
        }
        let blocks = gguf.len() / bb;
        let mut body = Vec::with_capacity(blocks * (bb - 2 * at.len()));
        let mut halves = Vec::with_capacity(blocks * at.len());
        for block in gguf.chunks_exact(bb) {
            let mut from = 0;
            for &o in at {
                body.extend_from_slice(&block[from..o]);
                halves.push(u16::from_le_bytes([block[o], block[o + 1]]));
                from = o + 2;
            }
            body.extend_from_slice(&block[from..]);
        }
        Ok(BlockRows {
            qtype: t,
            kernel,
            rows: n,
            body: dev.upload(&body)?,
            halves: dev.upload(&halves)?,
        })
    }

    /// The block type.
    pub fn qtype(&self) -> QuantType {
        self.qtype
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Device addresses of the bodies and scales, checked to hold rows of `k` values.
    fn device_args(&self, dev: &CudaDevice, k: usize) -> (u64, u64) {
        let t = self.qtype;
        let blocks = self.rows * (k / t.block_len());
        let nh = block_layout(t).map_or(0, |l| l.1.len());
        assert!(
            k.is_multiple_of(t.block_len())
                && self.body.len() >= blocks * (t.block_bytes() - 2 * nh)
                && self.halves.len() >= blocks * nh
        );
        (dev.ptr(&self.body), dev.ptr(&self.halves))
    }
}

impl CudaDevice {
    /// [`CudaDevice::matmul_in`] with weights in runs of block rows (`parts`, n rows in all):
    /// each part writes its columns of y.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn matmul_blocks(
        &self,
        x: &Buf,
        m: usize,
        parts: &[BlockRows],
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        input: GemvInput<'_>,
    ) -> Result<()> {
        assert!(y.len() >= m * n && parts.iter().map(|p| p.rows).sum::<usize>() == n);
        let input = self.input_args(input, x, m, k);
        let parts: Vec<PartArgs> = parts
            .iter()
            .map(|p| PartArgs {
                kernel: p.kernel,
                per256: p.qtype.block_len() == 256,
                w: p.device_args(self, k),
                rows: p.rows,
            })
            .collect();
        if m > BLOCK_GROUP_ROWS && !gemv_only() {
            return self.gemm_blocks(x, m, &parts, n, k, y, accumulate, input);
        }
        let mut col0 = 0usize;
        for p in parts {
            self.gemv_blocks_part(x, m, p, col0, n, k, y, accumulate, input)?;
            col0 += p.rows;
        }
        Ok(())
    }

    /// One launch of a block type's matrix-vector kernel: the part of `rows` output columns
    /// from `col0` of y [m, n], weights `w` (body and scales addresses, checked by the caller),
    /// `input` as from `input_args`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_blocks_part(
        &self,
        x: &Buf,
        m: usize,
        part: PartArgs,
        col0: usize,
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        (pn, eps, sw): (u64, f32, i32),
    ) -> Result<()> {
        let (rows, (pb, ph)) = (part.rows, part.w);
        assert!(y.len() >= m * n && col0 + rows <= n);
        // Shared memory per row: k codes, then two f32 per 32 values.
        let per_row = k + k / 4;
        let group = BLOCK_GROUP_ROWS
            .min(GEMV_SMEM_BYTES.min(self.max_smem()) / per_row)
            .min(m);
        if group == 0 {
            return Err(Error::Device(format!(
                "cuda: quantized products of rows of {k} values need {per_row} bytes of shared \
                 memory per row, more than this GPU's {} per block",
                self.max_smem()
            )));
        }
        let (px, py) = (self.ptr(x), self.mptr(y) + (col0 * 4) as u64);
        let (mi, ni, ki, ldy) = (m as i32, rows as i32, k as i32, n as i32);
        let (acc, g) = (i32::from(accumulate), group as i32);
        let mut b = self.args(&self.kernels().gemv_blocks[part.kernel]);
        b.arg(&px)
            .arg(&pb)
            .arg(&ph)
            .arg(&py)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&ldy)
            .arg(&acc)
            .arg(&pn)
            .arg(&eps)
            .arg(&sw)
            .arg(&g);
        let cfg = LaunchConfig {
            grid_dim: (self.gemv_blocks(rows) as u32, m.div_ceil(group) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: (group * per_row) as u32,
        };
        // SAFETY: block (bx, g) reads rows g·group .. of x (k or 2k values each, checked by
        // input_args) and k of the norm weight, `rows` rows of bodies and scales at pb / ph
        // (checked by the caller), and writes y[r n + col0 + c] for its rows r < m and columns
        // c < rows, col0 + rows <= n (asserted; y holds m n); its shared memory holds `group`
        // rows of k + k / 4 bytes.
        unsafe { self.go(&mut b, cfg, "gemv_blocks") }
    }

    /// [`CudaDevice::matmul_blocks`] for many rows: the rows quantized once, then the tiled
    /// kernel per part (`input`: the kernel arguments of the input mode).
    #[allow(clippy::too_many_arguments)]
    fn gemm_blocks(
        &self,
        x: &Buf,
        m: usize,
        parts: &[PartArgs],
        n: usize,
        k: usize,
        y: &mut Buf,
        accumulate: bool,
        (pn, eps, sw): (u64, f32, i32),
    ) -> Result<()> {
        let units = k / 32;
        // One buffer: codes (m k bytes), then xd and xa (m units f32 each).
        let mut buf = self.alloc_buf(m * k / 4 + 2 * m * units)?;
        let pq = self.mptr(&mut buf);
        let pd = pq + (m * k) as u64;
        let pa = pd + (m * units * 4) as u64;
        let (px, py) = (self.ptr(x), self.mptr(y));
        let (mi, ki, ldy, acc) = (m as i32, k as i32, n as i32, i32::from(accumulate));
        let mut quantized = [false; 2];
        let mut col0 = 0usize;
        for p in parts {
            let form = usize::from(p.per256);
            if !quantized[form] {
                // Parts of the other form re-quantize into the same buffer after this one's
                // products (same stream: in order).
                let mut b = self.args(&self.kernels().blk_quantize[form]);
                b.arg(&px)
                    .arg(&pq)
                    .arg(&pd)
                    .arg(&pa)
                    .arg(&mi)
                    .arg(&ki)
                    .arg(&pn)
                    .arg(&eps)
                    .arg(&sw);
                // SAFETY: block r < m reads row r of x (k or 2k values, checked by input_args)
                // and k of the norm weight, and writes that row's codes, xd and xa in buf
                // (m k bytes + 2 m k / 32 f32).
                unsafe { self.go(&mut b, per_row(m, 256), "blk_quantize") }?;
                quantized = [false; 2];
                quantized[form] = true;
            }
            let (pb, ph) = p.w;
            let pyc = py + (col0 * 4) as u64;
            let ni = p.rows as i32;
            let mut b = self.args(&self.kernels().gemm_blocks[p.kernel]);
            b.arg(&pq)
                .arg(&pd)
                .arg(&pa)
                .arg(&pb)
                .arg(&ph)
                .arg(&pyc)
                .arg(&mi)
                .arg(&ni)
                .arg(&ki)
                .arg(&ldy)
                .arg(&acc);
            let cfg = LaunchConfig {
                grid_dim: (
                    p.rows.div_ceil(BLOCK_TILE) as u32,
                    m.div_ceil(BLOCK_TILE) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: the kernel reads m rows of codes, xd and xa of buf, the part's bodies and
            // scales (device_args asserts their sizes), and writes y[r n + col0 + c] for r < m,
            // c < part rows, col0 + part rows <= n (y holds m n).
            unsafe { self.go(&mut b, cfg, "gemm_blocks") }?;
            col0 += p.rows;
        }
        Ok(())
    }
}
