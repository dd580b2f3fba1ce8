//! GGUF Q8_0 products on the device (kernels in quant.cu): a matrix is uploaded as int8 codes
//! and f16 scales; a product quantizes its input rows per block of 32 as the CPU backend does
//! (with the input's RMSNorm or SwiGLU fused), then multiplies with integer dot products: a
//! matrix-vector kernel that quantizes its rows itself for up to 64 rows (decode), a tiled
//! kernel after a quantizing pass for more (prefill).

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::launch::{per_row, GemvInput, MatrixData, GEMV_SMEM_BYTES};
use super::{Buf, CudaDevice};
use crate::{Error, Result};

/// Rows one block of the Q8_0 matrix-vector kernel takes (`Q8_GEMV_ROWS` in quant.cu).
const Q8_GEMV_ROWS: usize = 8;

/// Rows up to which products take the matrix-vector kernel (it can take groups of 8 rows side
/// by side, each streaming the weights, but at 64 rows that measured 3,448 tokens/s against
/// 4,669 for the tiled kernel on an H200): more rows take the tiled kernel.
const Q8_GEMV_MAX: usize = Q8_GEMV_ROWS;

/// Rows and columns of a tile of the batched kernel (`Q8_TILE` in quant.cu).
const TILE: usize = 64;

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
        let (pw, pwd, py) = (self.ptr(q), self.ptr(d), self.mptr(y));
        let (mi, ni, ki, acc) = (m as i32, n as i32, k as i32, i32::from(accumulate));
        let px = self.ptr(x);
        let smem = Q8_GEMV_ROWS.min(m) * k * 9 / 8;
        if m <= Q8_GEMV_MAX && smem <= GEMV_SMEM_BYTES.min(self.max_smem()) {
            // One launch: every block quantizes its group of rows itself.
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
        // The quantized rows in one buffer: codes (m k bytes), then scales (m k / 32 f32).
        let words = m * k / 4;
        let mut xq = self.alloc_buf(words + m * k / 32)?;
        let pq = self.mptr(&mut xq);
        let pd = pq + (words * 4) as u64;
        let mut b = self.args(&self.kernels().q8_quantize);
        b.arg(&px)
            .arg(&pq)
            .arg(&pd)
            .arg(&ki)
            .arg(&pn)
            .arg(&eps)
            .arg(&sw);
        // SAFETY: block r reads row r of x (k or 2k values, checked by input_args) and k of
        // the norm weight, and writes codes [r k, r k + k) and scales [r k/32, ...) of xq,
        // which holds m k / 4 + m k / 32 words.
        unsafe { self.go(&mut b, per_row(m, 256), "q8_quantize") }?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(TILE) as u32, m.div_ceil(TILE) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.args(&self.kernels().gemm_q8);
        b.arg(&pq)
            .arg(&pd)
            .arg(&pw)
            .arg(&pwd)
            .arg(&py)
            .arg(&mi)
            .arg(&ni)
            .arg(&ki)
            .arg(&acc);
        // SAFETY: the kernel reads m k codes and m k / 32 scales of xq, n k codes of q and
        // n k / 32 scales of d (asserted), and writes y[r n + c] for r < m, c < n (y holds m n).
        unsafe { self.go(&mut b, cfg, "gemm_q8") }
    }
}
