//! Vector math on embeddings (384..4096-d and any other length), on the engine's SIMD kernels.

use lattice_inference::ops;

/// Dot product. Vectors of different lengths are compared over the shorter one.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    ops::dot(&a[..n], &b[..n])
}

/// Cosine similarity (0 when either vector is zero). Vectors of different lengths are compared
/// over the shorter one.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    ops::cosine(&a[..n], &b[..n])
}

/// Scales `v` to unit L2 norm in place (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    ops::l2_normalize(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_identities() {
        let mut a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = a.iter().map(|x| 2.0 * x).collect();
        assert!((cosine(&a, &b) - 1.0).abs() < 1e-6);
        normalize(&mut a);
        assert!((dot(&a, &a) - 1.0).abs() < 1e-5);
        assert_eq!(cosine(&[0.0; 7], &[1.0; 7]), 0.0);
    }
}
