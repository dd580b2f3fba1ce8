//! GGUF quantized tensor formats and matrices that multiply with them directly.
//!
//! - [`QuantType`]: the supported GGML types and their block geometry.
//! - [`dequantize_row`] / [`quantize_row`] (`blocks`): the scalar reference conversions,
//!   bit-exact with ggml.
//! - [`act`]: on-the-fly Q8 quantization of activation rows, as llama.cpp's CPU backend.
//! - [`mod@reference`]: the scalar dot products (ggml's `ggml_vec_dot_*`), the tests' oracle.
//! - `repack`: the kernel layout (rows interleaved in groups of 16).
//! - [`QuantMatrix`]: a weight matrix owning its bytes, with a threaded SIMD `matmul` (kernels in
//!   `backend::cpu::qdot`).
//!
//! Products follow llama.cpp: each activation row is quantized to Q8_0 (Q4_0, Q5_0, Q8_0
//! weights), Q8_1 (Q4_1) or Q8_K (Q4_K, Q6_K) as ggml's x86 code does, then exact integer
//! block dot products are combined with the per-block float scales (`(d_w · d_a) · Σ`, f32).
//! The float accumulation order is per output (block after block), not llama.cpp's SIMD lane
//! order, so results agree with llama.cpp to f32 rounding, not bit for bit. F32 / F16 / BF16
//! matrices are converted to f32 once, at load, and multiplied with the f32 SGEMM
//! (`backend::cpu::gemm_bt`).

pub mod act;
mod blocks;
pub mod reference;
pub(crate) mod repack;

pub use blocks::{dequantize_row, quantize_row, QK_K};
pub use repack::GROUP_ROWS;

use crate::backend::cpu::qdot::{qmatmul, qtable, qtable_for};
use crate::backend::cpu::Isa;
use crate::{Error, Result};

/// A GGML tensor type this crate can store and multiply with.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// 32 values: f16 scale, 4-bit codes − 8.
    Q4_0,
    /// 32 values: f16 scale and min, 4-bit codes.
    Q4_1,
    /// 32 values: f16 scale, 5-bit codes − 16.
    Q5_0,
    /// 32 values: f16 scale, i8 codes.
    Q8_0,
    /// 256 values: f16 scales, 8 sub-blocks with 6-bit scales and mins, 4-bit codes.
    Q4_K,
    /// 256 values: f16 scale, 16 sub-blocks with i8 scales, 6-bit codes − 32.
    Q6_K,
}

impl QuantType {
    /// Every supported type.
    pub const ALL: [QuantType; 9] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q8_0,
        QuantType::Q4_K,
        QuantType::Q6_K,
    ];

    /// The type of GGML type id `ggml_type` (as in GGUF tensor infos), if supported.
    pub fn from_ggml(ggml_type: u32) -> Option<QuantType> {
        Some(match ggml_type {
            0 => QuantType::F32,
            1 => QuantType::F16,
            30 => QuantType::BF16,
            2 => QuantType::Q4_0,
            3 => QuantType::Q4_1,
            6 => QuantType::Q5_0,
            8 => QuantType::Q8_0,
            12 => QuantType::Q4_K,
            14 => QuantType::Q6_K,
            _ => return None,
        })
    }

    /// The GGML type id.
    pub fn ggml_type(self) -> u32 {
        match self {
            QuantType::F32 => 0,
            QuantType::F16 => 1,
            QuantType::BF16 => 30,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q8_0 => 8,
            QuantType::Q4_K => 12,
            QuantType::Q6_K => 14,
        }
    }

    /// GGML's name (`"q4_0"`, `"f16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "f32",
            QuantType::F16 => "f16",
            QuantType::BF16 => "bf16",
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q5_0 => "q5_0",
            QuantType::Q8_0 => "q8_0",
            QuantType::Q4_K => "q4_K",
            QuantType::Q6_K => "q6_K",
        }
    }

    /// Values per block (1 for the float types).
    pub fn block_len(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q8_0 => 32,
            QuantType::Q4_K | QuantType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::Q4_0 => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q8_0 => 34,
            QuantType::Q4_K => 144,
            QuantType::Q6_K => 210,
        }
    }

    /// Bytes of a row of `k` values; `None` when `k` is not a multiple of the block length.
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        if !k.is_multiple_of(self.block_len()) {
            return None;
        }
        (k / self.block_len()).checked_mul(self.block_bytes())
    }

    /// Whether this is a float type (F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(self, QuantType::F32 | QuantType::F16 | QuantType::BF16)
    }
}

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
                    blocks::dequantize_block(self.t, &raw[..bb], y);
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
                crate::backend::cpu::gemm_bt(
                    m,
                    self.n,
                    self.k,
                    x,
                    ld,
                    w,
                    ld,
                    y,
                    ldy.max(1),
                    accumulate,
                );
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
                let kt = crate::backend::cpu::kernels_for(isa).ok_or_else(unsupported)?;
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
