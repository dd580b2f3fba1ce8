//! Portable scalar kernels: the reference every SIMD kernel is tested against, and the
//! elementwise half of the portable table on CPUs without AVX2 (its GEMM is the blocked driver
//! over `portable`). Written for clarity and accuracy (f64 where it matters), not speed.

/// See [`super::gemm_bt`].
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
    for i in 0..m {
        let ar = &a[i * lda..i * lda + k];
        for j in 0..n {
            let br = &b[j * ldb..j * ldb + k];
            let s = dot(ar, br);
            let cij = &mut c[i * ldc + j];
            *cij = if accumulate { *cij + s } else { s };
        }
    }
}

/// See [`super::gemm_nn`].
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
    for i in 0..m {
        let cr = &mut c[i * ldc..i * ldc + n];
        if !accumulate {
            cr.fill(0.0);
        }
        for p in 0..k {
            let aip = a[i * lda + p];
            let br = &b[p * ldb..p * ldb + n];
            for (cv, bv) in cr.iter_mut().zip(br) {
                *cv += aip * bv;
            }
        }
    }
}

/// See [`super::layer_norm`].
pub fn layer_norm(x: &mut [f32], dim: usize, gamma: &[f32], beta: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(dim) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row
            .iter()
            .map(|&v| {
                let d = v as f64 - mean;
                d * d
            })
            .sum::<f64>()
            / dim as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = ((*v as f64 - mean) * inv) as f32 * g + b;
        }
    }
}

/// Error function in f64 (musl's `erf` through the `libm` crate, < 1 ulp): the oracle the SIMD
/// polynomial is tested against.
pub fn erf_f64(x: f64) -> f64 {
    libm::erf(x)
}

/// Complementary error function in f64 (musl's `erfc` through `libm`, < 1 ulp).
pub fn erfc_f64(x: f64) -> f64 {
    libm::erfc(x)
}

/// See [`super::gelu_erf`]. Computed as `x · erfc(-x/√2) / 2` in f64, which equals
/// `x · (1 + erf(x/√2)) / 2` but keeps full relative accuracy in the negative tail.
pub fn gelu_erf(x: &mut [f32]) {
    for v in x {
        let xf = *v as f64;
        *v = (0.5 * xf * erfc_f64(-xf * std::f64::consts::FRAC_1_SQRT_2)) as f32;
    }
}

/// See [`super::dequant_i32`].
pub fn dequant_i32(y: &mut [&mut [f32]], sums: &[i32], lds: usize, deq: &super::Dequant<'_>) {
    for (r, row) in y.iter_mut().enumerate() {
        for (i, o) in row.iter_mut().enumerate() {
            let mut v = sums[r * lds + i] as f32 * deq.x_steps[r] * deq.w_steps[i];
            if let Some(b) = deq.bias {
                v += b[i];
            }
            *o = if deq.accumulate { *o + v } else { v };
        }
        if deq.gelu {
            gelu_erf(row);
        }
    }
}

/// See [`super::erf`].
pub fn erf(x: &mut [f32]) {
    for v in x {
        *v = erf_f64(*v as f64) as f32;
    }
}

/// See [`super::softmax`].
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// See [`super::add_bias`].
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    }
}

/// See [`super::add_product`].
pub fn add_product(x: &mut [f32], a: &[f32], b: &[f32]) {
    for ((x, &a), &b) in x.iter_mut().zip(a).zip(b) {
        *x += a * b;
    }
}

/// See [`super::add_assign`].
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// See [`super::dot_bf16`] (f64 sums, as [`dot`]).
pub fn dot_bf16(a: &[u16], x: &[f32]) -> f32 {
    a.iter()
        .zip(x)
        .map(|(&b, &y)| f32::from_bits((b as u32) << 16) as f64 * y as f64)
        .sum::<f64>() as f32
}

/// See [`super::axpy_bf16`].
pub fn axpy_bf16(x: &mut [f32], c: f32, b: &[u16]) {
    for (a, &v) in x.iter_mut().zip(b) {
        *a += c * f32::from_bits((v as u32) << 16);
    }
}

/// See [`super::axpy`].
pub fn axpy(x: &mut [f32], c: f32, y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += c * b;
    }
}

/// See [`super::dot`]. Accumulates in f64, so the reference GEMM and dot are accurate to
/// about an ulp of the result whatever `k`.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 * y as f64)
        .sum::<f64>() as f32
}

/// See [`super::scale`].
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// See [`super::exp`].
pub fn exp(x: &mut [f32]) {
    for v in x {
        *v = (*v as f64).exp() as f32;
    }
}

/// See [`super::silu`].
pub fn silu(x: &mut [f32]) {
    for v in x {
        *v /= 1.0 + (-*v as f64).exp() as f32;
    }
}

/// See [`super::silu_mul`].
pub fn silu_mul(g: &mut [f32], u: &[f32]) {
    for (g, &u) in g.iter_mut().zip(u) {
        *g = *g / (1.0 + (-*g as f64).exp() as f32) * u;
    }
}

/// See [`super::tanh`].
pub fn tanh(x: &mut [f32]) {
    for v in x {
        *v = v.tanh();
    }
}

/// See [`super::l2_normalize`].
pub fn l2_normalize(x: &mut [f32]) {
    let norm = x
        .iter()
        .map(|&v| (v as f64) * (v as f64))
        .sum::<f64>()
        .sqrt();
    let inv = 1.0 / norm.max(1e-12);
    for v in x {
        *v = (*v as f64 * inv) as f32;
    }
}

/// See [`super::cosine`].
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa * bb).sqrt()) as f32
}
