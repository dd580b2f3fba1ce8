//! Heads over an encoder's per-token hidden states: sequence pooling (mean, CLS, last token,
//! max) and L2 normalization, with sentence-transformers' exact semantics.

use crate::ops;

/// How a sequence's token states become one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Average over the sequence's tokens (special tokens included, as sentence-transformers).
    Mean,
    /// The first token (`[CLS]` / `<s>`).
    Cls,
    /// The last token (decoder-style embedding models).
    LastToken,
    /// Elementwise maximum over the tokens.
    Max,
}

/// Pools `hidden` f32 [n_tokens, hidden_size] per sequence → f32 [n_seqs, hidden_size].
/// Sequences of length 0 pool to zeros.
pub fn pool(
    hidden: &[f32],
    hidden_size: usize,
    cu_seqlens: &[usize],
    pooling: Pooling,
) -> Vec<f32> {
    let n_seqs = cu_seqlens.len().saturating_sub(1);
    let mut out = vec![0.0f32; n_seqs * hidden_size];
    for (s, o) in out.chunks_exact_mut(hidden_size).enumerate() {
        let (start, end) = (cu_seqlens[s], cu_seqlens[s + 1]);
        if start == end {
            continue;
        }
        let row = |t: usize| &hidden[t * hidden_size..(t + 1) * hidden_size];
        match pooling {
            Pooling::Cls => o.copy_from_slice(row(start)),
            Pooling::LastToken => o.copy_from_slice(row(end - 1)),
            Pooling::Mean => {
                for t in start..end {
                    ops::add_assign(o, row(t));
                }
                ops::scale(o, 1.0 / (end - start) as f32);
            }
            Pooling::Max => {
                o.copy_from_slice(row(start));
                for t in start + 1..end {
                    for (a, &b) in o.iter_mut().zip(row(t)) {
                        *a = a.max(b);
                    }
                }
            }
        }
    }
    out
}

/// Divides each row of `x` by its L2 norm (clamped below at 1e-12, as `F.normalize`).
pub fn l2_normalize_rows(x: &mut [f32], dim: usize) {
    for row in x.chunks_exact_mut(dim) {
        ops::l2_normalize(row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_each_sequence() {
        let h = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 0.0]; // 4 tokens × 2
        let cu = [0, 3, 4];
        assert_eq!(pool(&h, 2, &cu, Pooling::Mean), vec![3.0, 4.0, 7.0, 0.0]);
        assert_eq!(pool(&h, 2, &cu, Pooling::Cls), vec![1.0, 2.0, 7.0, 0.0]);
        assert_eq!(
            pool(&h, 2, &cu, Pooling::LastToken),
            vec![5.0, 6.0, 7.0, 0.0]
        );
        assert_eq!(pool(&h, 2, &cu, Pooling::Max), vec![5.0, 6.0, 7.0, 0.0]);
        let mut v = vec![3.0, 4.0, 0.0, 0.0];
        l2_normalize_rows(&mut v, 2);
        assert_eq!(v, vec![0.6, 0.8, 0.0, 0.0]);
    }
}
