//! [`QuantMatrix`]: the executable quantized weight matrix of the CPU backend. It owns its
//! values, repacked at load into the kernel layout of `repack` (quantized types) or converted
//! to f32 (float types), and multiplies with them: quantized products through the threaded
//! integer-SIMD driver of `qdot`, float ones through the f32 SGEMM ([`gemm_bt`]).
//!
//! The formats themselves (block geometry, reference (de)quantization, activation
//! quantization) are `crate::quant`'s.

use super::qdot::{qmatmul, qtable, qtable_for};
use super::repack::{self, GROUP_ROWS};
use super::{gemm_bt, kernels_for, Isa};
use crate::quant::{dequantize_block, dequantize_row, QuantType};
use crate::{Error, Result};

/// How a [`QuantMatrix`] holds its values.
#[derive(Clone)]
enum Storage {
    /// Float types: f32, `n × k` row-major (converted at load).
    F32(Vec<f32>),
    /// Quantized types: the group layout of `repack`.
    Packed(Vec<u8>),
}

/// A weight matrix of `n_rows` (output features) × `k` (input features), built from GGUF
/// row-major blocks and owning its bytes.
///
/// Quantized types are repacked at load into rows interleaved in groups of 16 (same number of
/// bytes, except Q4_K: +2.8% for unpacked 6-bit scales), the layout the SIMD kernels read;
/// float types are converted to f32.
#[derive(Clone)]
pub struct QuantMatrix {
    t: QuantType,
    n: usize,
    k: usize,
    data: Storage,
}

impl std::fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("type", &self.t)
            .field("n_rows", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl QuantMatrix {
    /// Builds a matrix from `data`, `n_rows` rows of `k` values of type `t` in GGUF layout.
    ///
    /// Fails when `k` is not a multiple of the block length or `data` is not exactly
    /// `n_rows · row_bytes(k)` bytes.
    pub fn new(t: QuantType, n_rows: usize, k: usize, data: &[u8]) -> Result<Self> {
        let rb = t.row_bytes(k).ok_or_else(|| Error::Shape {
            op: "QuantMatrix::new",
            reason: format!(
                "k = {k} is not a multiple of the {} block of {}",
                t.name(),
                t.block_len()
            ),
        })?;
        let expected = rb.checked_mul(n_rows);
        if expected != Some(data.len()) {
            return Err(Error::Shape {
                op: "QuantMatrix::new",
                reason: format!(
                    "{n_rows} × {k} {} takes {} bytes, got {}",
                    t.name(),
                    expected.map_or("too many".to_string(), |e| e.to_string()),
                    data.len()
                ),
            });
        }
        let data = if t.is_float() {
            let mut f = vec![0f32; n_rows * k];
            dequantize_row(t, data, &mut f)?;
            Storage::F32(f)
        } else {
            Storage::Packed(repack::repack(t, n_rows, k, data))
        };
        Ok(QuantMatrix {
            t,
            n: n_rows,
            k,
            data,
        })
    }

    /// The stored type.
    pub fn qtype(&self) -> QuantType {
        self.t
    }

    /// Rows (output features).
    pub fn n_rows(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of the matrix in its GGUF encoding (what a matrix-vector product streams, up to
    /// the repacking overhead).
    pub fn gguf_bytes(&self) -> usize {
        self.n * self.t.row_bytes(self.k).unwrap_or(0)
    }

    /// All values, `n_rows × k` row-major f32.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        if self.k > 0 {
            for (r, row) in out.chunks_exact_mut(self.k).enumerate() {
                self.dequantize_row_into(r, row);
            }
        }
        out
    }

    /// The matrix in its GGUF encoding (rows of blocks, as in the file; the repacking undone),
    /// for another device's layout. `None` for float types (held as f32).
    pub fn to_gguf(&self) -> Option<Vec<u8>> {
        let Storage::Packed(p) = &self.data else {
            return None;
        };
        let (bl, bb) = (self.t.block_len(), self.t.block_bytes());
        let nb = self.k / bl;
        let rec = repack::record_bytes(self.t);
        let mut out = vec![0u8; self.n * nb * bb];
        for (row, raw) in out.chunks_exact_mut(nb * bb).enumerate() {
            let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
            for (b, blk) in raw.chunks_exact_mut(bb).enumerate() {
                let o = (g * nb + b) * rec;
                repack::unrepack_block(self.t, &p[o..o + rec], r, blk);
            }
        }
        Some(out)
    }

    /// Row `row` as f32 into `out` (`k` long), e.g. an embedding lookup.
    ///
    /// Panics if `row >= n_rows` or `out.len() != k` (a caller bug, not input).
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.n && out.len() == self.k,
            "dequantize_row_into: bad row/len"
        );
        match &self.data {
            Storage::F32(f) => out.copy_from_slice(&f[row * self.k..(row + 1) * self.k]),
            Storage::Packed(p) => {
                let (bl, bb) = (self.t.block_len(), self.t.block_bytes());
                let nb = self.k / bl;
                let rec = repack::record_bytes(self.t);
                let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
                let mut raw = [0u8; 256];
                for (b, y) in out.chunks_exact_mut(bl).enumerate() {
                    let o = (g * nb + b) * rec;
                    repack::unrepack_block(self.t, &p[o..o + rec], r, &mut raw[..bb]);
                    dequantize_block(self.t, &raw[..bb], y);
                }
            }
        }
    }

    /// `y[m × n_rows] = x[m × k] · Wᵀ` (overwrites `y`), threaded over output rows with rayon,
    /// with the best kernels for this CPU.
    ///
    /// Panics if `x.len() != m · k` or `y.len() != m · n_rows` (a caller bug).
    pub fn matmul(&self, x: &[f32], m: usize, y: &mut [f32]) {
        self.check_shapes(x, m, y);
        self.matmul_strided(x, m, y, self.n, false);
    }

    /// [`QuantMatrix::matmul`] into rows of `y` that are `ldy ≥ n_rows` apart, adding the
    /// product to `y` with `accumulate`: writes `y[i·ldy + j]` for `i < m`, `j < n_rows` and
    /// nothing else. Lets several matrices (e.g. Q/K/V parts of different types) fill the
    /// columns of one output, or add into a residual, without a temporary.
    ///
    /// Panics if `x.len() != m · k`, `ldy < n_rows` or `y` is shorter than
    /// `(m − 1) · ldy + n_rows` (a caller bug).
    pub fn matmul_strided(&self, x: &[f32], m: usize, y: &mut [f32], ldy: usize, accumulate: bool) {
        assert!(
            x.len() == m * self.k && ldy >= self.n && (m == 0 || y.len() >= (m - 1) * ldy + self.n),
            "QuantMatrix::matmul_strided: x is {} (want {}·{}), y is {} with ldy {} (n = {})",
            x.len(),
            m,
            self.k,
            y.len(),
            ldy,
            self.n
        );
        match &self.data {
            Storage::F32(w) => {
                let ld = self.k.max(1);
                gemm_bt(m, self.n, self.k, x, ld, w, ld, y, ldy.max(1), accumulate);
            }
            Storage::Packed(p) => qmatmul(
                qtable(),
                self.t,
                self.n,
                self.k,
                p,
                x,
                m,
                y,
                ldy,
                accumulate,
            ),
        }
    }

    fn check_shapes(&self, x: &[f32], m: usize, y: &[f32]) {
        assert!(
            x.len() == m * self.k && y.len() == m * self.n,
            "QuantMatrix::matmul: x is {} (want {}·{}), y is {} (want {}·{})",
            x.len(),
            m,
            self.k,
            y.len(),
            m,
            self.n
        );
    }

    /// [`QuantMatrix::matmul`] with the kernels of a given instruction set (tests, benches).
    /// For float types `isa` selects the SGEMM table. Fails if this CPU does not support it.
    ///
    /// Panics if `x.len() != m · k` or `y.len() != m · n_rows`.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
        self.check_shapes(x, m, y);
        let unsupported = || Error::InvalidInput(format!("instruction set {isa} not supported"));
        match &self.data {
            Storage::F32(w) => {
                let kt = kernels_for(isa).ok_or_else(unsupported)?;
                let ld = self.k.max(1);
                kt.gemm_bt(m, self.n, self.k, x, ld, w, ld, y, self.n.max(1), false);
            }
            Storage::Packed(p) => {
                let tab = qtable_for(isa).ok_or_else(unsupported)?;
                qmatmul(tab, self.t, self.n, self.k, p, x, m, y, self.n, false);
            }
        }
        Ok(())
    }
}
