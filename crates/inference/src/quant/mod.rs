//! GGUF quantized tensor formats: a leaf module of data and reference math, with no kernels.
//!
//! - [`QuantType`]: the supported GGML types and their block geometry.
//! - [`dequantize_row`] / [`quantize_row`] (`blocks`): the scalar reference conversions,
//!   bit-exact with ggml.
//! - [`act`]: on-the-fly Q8 quantization of activation rows, as llama.cpp's CPU backend.
//! - [`mod@reference`]: the scalar dot products (ggml's `ggml_vec_dot_*`), the tests' oracle.
//!
//! Execution lives in the CPU backend, which imports these formats (never the reverse):
//! `backend::cpu::QuantMatrix` owns a weight matrix repacked into the kernel layout
//! (`backend::cpu::repack`, rows interleaved in groups of 16) and multiplies with it through the
//! SIMD kernels of `backend::cpu::qdot`.
//!
//! Products follow llama.cpp: each activation row is quantized to Q8_0 (Q4_0, Q5_0, Q8_0
//! weights), Q8_1 (Q4_1) or Q8_K (Q4_K, Q6_K) as ggml's x86 code does, then exact integer
//! block dot products are combined with the per-block float scales (`(d_w · d_a) · Σ`, f32).
//! The float accumulation order is per output (block after block), not llama.cpp's SIMD lane
//! order, so results agree with llama.cpp to f32 rounding, not bit for bit. F32 / F16 / BF16
//! matrices are converted to f32 once, at load, and multiplied with the f32 SGEMM.

pub mod act;
mod blocks;
pub mod hadamard;
pub mod reference;
pub mod ternary;

pub use blocks::{dequantize_row, quantize_row, QK_K};
// Block helpers the CPU backend's repacked layout needs.
pub(crate) use blocks::{dequantize_block, q4k_pack_scales, q4k_scale_min};

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
