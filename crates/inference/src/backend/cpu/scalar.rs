//! Portable scalar kernels: the reference every SIMD kernel is tested against, and the fallback
//! on CPUs without AVX2.

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

/// See [`super::gelu_erf`].
pub fn gelu_erf(x: &mut [f32]) {
    for v in x {
        let xf = *v as f64;
        *v = (0.5 * xf * (1.0 + erf_f64(xf * std::f64::consts::FRAC_1_SQRT_2))) as f32;
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

/// See [`super::add_assign`].
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// See [`super::dot`].
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// See [`super::scale`].
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// See [`super::tanh`].
pub fn tanh(x: &mut [f32]) {
    for v in x {
        *v = v.tanh();
    }
}
