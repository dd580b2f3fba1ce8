//! CPU kernels with runtime SIMD dispatch (AVX-512F, AVX2+FMA, portable).
//!
//! The free functions here are the contract the rest of the crate uses; each forwards to the
//! kernel table of the best instruction set this CPU supports, selected once at first use
//! ([`kernels`]). [`kernels_for`] returns the table of a specific instruction set, so tests and
//! benchmarks can compare every available one against the reference in [`scalar`].
//!
//! Matrix conventions: f32, row-major, with explicit leading dimensions (`lda` = distance in
//! elements between consecutive rows). Shapes are checked by `ops` before these are called;
//! here, inconsistent lengths panic (the GEMMs check every slice against its shape before
//! touching raw pointers), and they never read or write outside the given slices.
//!
//! Files: `detect` (which instruction sets are usable), `dispatch` (the tables), `gemm`,
//! `pack`, `packed`, `microkernel` and `threads` (SGEMM), `simd` (the vector vocabulary),
//! `vector` and `vmath` (elementwise kernels and elementary functions), `x86/` (AVX-512 and
//! AVX2 tokens and tables), `portable` (plain-Rust vectors), `scalar` (the reference), `attn`
//! (single-query decode attention over f32 or f16 key/value rows, with its own selection).
//!
//! Quantized execution: [`QuantMatrix`] (`qmatrix`, the executable GGUF weight matrix) owns
//! its weights in the kernel layout of `repack` (rows in groups of [`GROUP_ROWS`]); `qdot`
//! (driver and per-instruction-set tables) and `qkernels` (the generic tiles) multiply with
//! them. The block formats, reference math and activation quantization they build on are
//! `crate::quant`'s, a leaf that imports nothing from here.

#![allow(unsafe_code)]

pub mod attn;
pub mod bf16;
mod detect;
mod dispatch;
mod gemm;
pub mod int8;
mod lowrank;
mod microkernel;
mod pack;
mod packed;
mod portable;
pub mod qdot;
mod qkernels;
mod qmatrix;
mod repack;
pub mod scalar;
pub mod ternary;
// Parts of the vector vocabulary and the generic elementwise kernels are only instantiated by
// the x86 tables (the portable table uses the scalar references).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod simd;
mod threads;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod vector;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod vmath;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use detect::Isa;
pub use dispatch::{kernels, kernels_for, Kernels};
pub use int8::Int8Matrix;
pub use lowrank::{add_low_rank, Delta, Values};
pub use packed::{Bf16Rows, PackedBf16, PackedWeights};
pub use qmatrix::QuantMatrix;
pub use repack::GROUP_ROWS;
pub use ternary::TernaryMatrix;
pub use threads::{flush_subnormals, flush_wanted, pool_builder};

/// Runs `f` on a worker thread of the thread pool (directly when already on one).
///
/// Every parallel kernel called from outside the pool hands its work to the workers and sleeps
/// on a condition variable until they finish; a decode step makes a hundred such calls, and the
/// sleeps and wake-ups cost more than small kernels. Wrapping a whole forward pass pays that
/// once: inside, parallel kernels split work by stealing, without sleeping.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        f()
    } else {
        let mut out = None;
        rayon::scope(|_| out = Some(f()));
        out.expect("the scope ran the closure")
    }
}

/// `f(i)` for every `i` in `0..n` on the worker pool, results in order; tasks are handed out at
/// least `min_len` at a time (`min_len >= n` runs them all on the calling thread). The one way
/// code above the backend spreads independent tasks (attention heads, sequences) over cores.
/// With at least one batch of tasks per thread, the kernels a task calls stay on its thread.
pub fn par_map<T: Send>(n: usize, min_len: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    use rayon::prelude::*;
    if min_len >= n {
        return (0..n).map(f).collect();
    }
    let busy = n.div_ceil(min_len.max(1)) >= threads::count();
    (0..n)
        .into_par_iter()
        .with_min_len(min_len.max(1))
        .map(|i| threads::in_task(busy, || f(i)))
        .collect()
}

/// `f(item)` for every item of `items`, in parallel on the thread pool when `parallel`; the
/// results in order. With at least one item per thread, the kernels a task calls stay on its
/// thread.
pub fn par_map_mut<T: Send, R: Send>(
    items: &mut [T],
    parallel: bool,
    f: impl Fn(&mut T) -> R + Sync + Send,
) -> Vec<R> {
    use rayon::prelude::*;
    if parallel {
        let busy = items.len() >= threads::count();
        items
            .par_iter_mut()
            .map(|item| threads::in_task(busy, || f(item)))
            .collect()
    } else {
        items.iter_mut().map(f).collect()
    }
}

/// `f(i, chunk)` for the consecutive chunks of `chunk` values of `out` (the last may be
/// shorter), on the worker pool when `parallel`, else in order on the calling thread.
pub fn par_chunks_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    parallel: bool,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    use rayon::prelude::*;
    let chunk = chunk.max(1);
    if parallel {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// Values from which [`copy_rows`] spreads a copy over the workers.
const PAR_COPY: usize = 1 << 16;

/// Copies `width` values of each of `rows` rows from `src` (rows `src_ld` apart) to `dst` (rows
/// `dst_ld` apart): column ranges of packed rows (a head, a projection's part) taken out or
/// written back, blocks of rows on the workers for large copies. Panics if a slice is too short
/// or rows would overlap (`width > dst_ld`).
pub fn copy_rows(
    src: &[f32],
    src_ld: usize,
    dst: &mut [f32],
    dst_ld: usize,
    rows: usize,
    width: usize,
) {
    if rows == 0 || width == 0 {
        return;
    }
    let (src_end, dst_end) = ((rows - 1) * src_ld + width, (rows - 1) * dst_ld + width);
    assert!(
        src.len() >= src_end && dst.len() >= dst_end && (rows == 1 || width <= dst_ld),
        "copy_rows: {rows} rows of {width} from {} values ({src_ld} apart) to {} ({dst_ld} apart)",
        src.len(),
        dst.len()
    );
    let per_task = (PAR_COPY / 4 / width).max(1);
    let step = if rows == 1 {
        dst_end
    } else {
        per_task * dst_ld
    };
    par_chunks_mut(
        &mut dst[..dst_end],
        step,
        rows * width >= PAR_COPY,
        |i, part| {
            for r in 0..per_task.min(rows - i * per_task) {
                let row = i * per_task + r;
                part[r * dst_ld..r * dst_ld + width]
                    .copy_from_slice(&src[row * src_ld..row * src_ld + width]);
            }
        },
    );
}

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
    kernels().gemm_bt(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

/// [`gemm_bt`] with a fused epilogue: `c = act((accumulate ? c : 0) + a·bᵀ + bias)`, where
/// `bias` (f32 `[n]`, at least `n` long) is added to every row when given, and `act` is exact
/// GELU ([`gelu_erf`]) when `gelu` is set, the identity otherwise.
///
/// The epilogue runs on each output tile right after its last product, while it is still in
/// L1, which saves the separate passes of `add_bias` and `gelu_erf` over `c`. With
/// `accumulate` it also fuses a residual add (`c` holds the residual).
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt_bias(
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
    bias: Option<&[f32]>,
    gelu: bool,
) {
    kernels().gemm_bt_bias(m, n, k, a, lda, b, ldb, c, ldc, accumulate, bias, gelu)
}

/// Packs a weight matrix `w[n×k]` (rows `ldw` apart, the `nn.Linear` layout) once, for
/// [`gemm_bt_packed`]. Costs one pass over `w` and about as much memory again; worth it for
/// any weight used in more than one product.
pub fn pack_weights(n: usize, k: usize, w: &[f32], ldw: usize) -> PackedWeights {
    kernels().pack_weights(n, k, w, ldw)
}

/// [`pack_weights`] kept in 16 bits ([`PackedBf16`]): from f32 values when every one is
/// exactly a bf16 value (else `None`), or from a checkpoint's bf16 bits; packed without an f32
/// copy of the whole matrix.
pub fn pack_weights_bf16(n: usize, k: usize, src: Bf16Rows<'_>) -> Option<PackedBf16> {
    kernels().pack_weights_bf16(n, k, src)
}

/// [`gemm_bt_bias`] with pre-packed weights: `c = act((accumulate ? c : 0) + a·wᵀ + bias)`,
/// `a` f32 `[m×w.k()]` (rows `lda` apart), `c` f32 `[m×w.n()]` (rows `ldc` apart).
///
/// Skips the per-call transpose of the weights, which dominates for small batches (2× faster
/// at 8 tokens, about 10% at 128).
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt_packed(
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedWeights,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    bias: Option<&[f32]>,
    gelu: bool,
) {
    kernels().gemm_bt_packed(m, a, lda, w, c, ldc, accumulate, bias, gelu)
}

/// [`gemm_bt_packed`] over bf16 weights ([`PackedBf16`]): bit-identical results, half the bytes.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt_packed_bf16(
    m: usize,
    a: &[f32],
    lda: usize,
    w: &PackedBf16,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    bias: Option<&[f32]>,
    gelu: bool,
) {
    kernels().gemm_bt_packed_bf16(m, a, lda, w, c, ldc, accumulate, bias, gelu)
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
    kernels().gemm_nn(m, n, k, a, lda, b, ldb, c, ldc, accumulate)
}

/// In-place layer norm over each row of `x` (rows of `dim` elements):
/// `y = (x - mean) / sqrt(var + eps) * gamma + beta`, biased variance, as `torch.nn.LayerNorm`.
pub fn layer_norm(x: &mut [f32], dim: usize, gamma: &[f32], beta: &[f32], eps: f32) {
    kernels().layer_norm(x, dim, gamma, beta, eps)
}

/// In-place exact GELU, `x * 0.5 * (1 + erf(x / sqrt(2)))` (not the tanh approximation).
pub fn gelu_erf(x: &mut [f32]) {
    kernels().gelu_erf(x)
}

/// In-place GELU with `erf` from a rational fit: within `2.5e-7 · |x|` of [`gelu_erf`] at a
/// third of its work, for products that change numbers far more already (int8, bf16
/// activations, quantized blocks); exact f32 math keeps [`gelu_erf`].
pub fn gelu_rational(x: &mut [f32]) {
    kernels().gelu_rational(x)
}

/// How [`dequant_i32`] (and [`int8::Int8Matrix::matmul_dequant`]) turn int8 products' integer
/// sums into outputs.
#[derive(Clone, Copy, Debug)]
pub struct Dequant<'a> {
    /// Each activation row's step (value · step ≈ activation).
    pub x_steps: &'a [f32],
    /// Each weight row's (output column's) step.
    pub w_steps: &'a [f32],
    /// Added to every output row.
    pub bias: Option<&'a [f32]>,
    /// Add to the outputs instead of overwriting them.
    pub accumulate: bool,
    /// Apply GELU last, with `erf` from a rational fit: within `2.5e-7 · |x|` of the exact
    /// GELU, far inside the int8 products' own error, at a third of the exact form's work.
    pub gelu: bool,
}

/// The finish of a tile of an int8 product: `y[r][i] (+)= sums[r·lds + i] · x_steps[r] ·
/// w_steps[i] (+ bias[i])`, then GELU if asked ([`Dequant::gelu`]), for every row `r` of `y` (rows of
/// equal length).
///
/// Panics if the rows differ in length, `lds` is shorter than a row, `sums` is too short or
/// the steps / bias are shorter than the rows need (a caller bug).
pub fn dequant_i32(y: &mut [&mut [f32]], sums: &[i32], lds: usize, deq: &Dequant<'_>) {
    kernels().dequant_i32(y, sums, lds, deq)
}

/// In-place error function `erf(x)`, within a few ulp.
pub fn erf(x: &mut [f32]) {
    kernels().erf(x)
}

/// In-place `e^x`, within a few ulp: 0 below about -104, inf above 88.72.
pub fn exp(x: &mut [f32]) {
    kernels().exp(x)
}

/// In-place numerically stable softmax of one row.
pub fn softmax(x: &mut [f32]) {
    kernels().softmax(x)
}

/// `x[i] += bias[i % bias.len()]` for every row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    kernels().add_bias(x, bias)
}

/// `x[i] += y[i]` (residual connections).
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    kernels().add_assign(x, y)
}

/// `x[i] += a[i] · b[i]` (equal lengths), the product rounded before the sum: the same values
/// as the plain Rust expression, for code that must match a scalar loop bit for bit.
pub fn add_product(x: &mut [f32], a: &[f32], b: &[f32]) {
    kernels().add_product(x, a, b)
}

/// SiLU in place, `x / (1 + exp(−x))`, with the vectorized `exp` of [`exp`].
pub fn silu(x: &mut [f32]) {
    kernels().silu(x)
}

/// SwiGLU in place: `g[i] = silu(g[i]) · u[i]` (equal lengths), as [`silu`] then one product.
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    kernels().silu_mul(g, u)
}

/// `x += c · y` elementwise (equal lengths).
pub fn axpy(x: &mut [f32], c: f32, y: &[f32]) {
    kernels().axpy(x, c, y)
}

/// `x += c · b` elementwise with `b` bf16 (its bits), widened to f32 exactly.
pub fn axpy_bf16(x: &mut [f32], c: f32, b: &[u16]) {
    kernels().axpy_bf16(x, c, b)
}

/// `Σ a_i x_i` with `a` bf16 (its bits), widened to f32 exactly; f32 products and sums.
pub fn dot_bf16(a: &[u16], x: &[f32]) -> f32 {
    kernels().dot_bf16(a, x)
}

/// Dot product of two equal-length vectors.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    kernels().dot(a, b)
}

/// Sum of squares of a vector.
pub fn sum_squares(a: &[f32]) -> f32 {
    kernels().sum_squares(a)
}

/// `x[i] *= s`.
pub fn scale(x: &mut [f32], s: f32) {
    kernels().scale(x, s)
}

/// In-place tanh.
pub fn tanh(x: &mut [f32]) {
    kernels().tanh(x)
}

/// In-place L2 normalization, `x / max(‖x‖₂, 1e-12)` (as `torch.nn.functional.normalize`), for
/// embedding vectors.
pub fn l2_normalize(x: &mut [f32]) {
    kernels().l2_normalize(x)
}

/// Cosine similarity of two equal-length vectors, `a·b / (‖a‖ ‖b‖)`; 0 if either is zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    kernels().cosine(a, b)
}

/// Name of the instruction set the dispatch table selected (`"avx512"`, `"avx2"` or `"scalar"`).
pub fn isa() -> &'static str {
    kernels().isa().name()
}
