//! Scaled dot-product attention. Bidirectional (encoder) attention over a packed
//! variable-length batch lives here: the tokens of all sequences lie back to back (`cu_seqlens`
//! marks the boundaries), and each sequence attends only to itself, so no FLOP is spent on
//! padding. Causal (decoder) attention over a KV cache is in [`causal`]; the gated delta rule of
//! linear-attention (Gated DeltaNet) layers in [`gdn`].
//!
//! One task per (sequence, head) runs on the worker pool: `S = Q·Kᵀ · scale (+ bias)`, a row
//! softmax, then `O = S·V`, all reading Q, K, V in place through strides.

mod causal;
mod entry;
pub mod gdn;
mod gdn_layer;

pub use causal::{
    cached_attention, cached_decode_batch, causal_attention, decode_attention,
    decode_attention_batch, decode_attention_views, CausalShape,
};
pub use entry::{attend, attend_qkv, attend_tensors, QkvHeads, ROW_BY_ROW};
pub use gdn_layer::GdnLayer;

use crate::backend::cpu;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

/// The lengths of the sequences in a packed batch, as cumulative offsets:
/// sequence `i` owns tokens `cu_seqlens[i]..cu_seqlens[i + 1]`.
pub fn check_cu_seqlens(cu_seqlens: &[usize], n_tokens: usize) -> Result<()> {
    let ok = cu_seqlens.first() == Some(&0)
        && cu_seqlens.last() == Some(&n_tokens)
        && cu_seqlens.windows(2).all(|w| w[0] <= w[1]);
    if ok {
        Ok(())
    } else {
        Err(Error::Shape {
            op: "attention",
            reason: format!(
                "cu_seqlens {cu_seqlens:?} must start at 0, be non-decreasing and end at {n_tokens}"
            ),
        })
    }
}

/// An additive attention bias shared by every sequence, indexed by head and position pair:
/// `values[h * max_len * max_len + i * max_len + j]` (f32 [n_heads, max_len, max_len]); a
/// sequence of length `L` uses the top-left `L × L` block of each head.
#[derive(Debug)]
pub struct PositionBias {
    /// f32 [n_heads, max_len, max_len].
    pub values: Vec<f32>,
    /// Side of each head's square.
    pub max_len: usize,
}

/// Bidirectional multi-head attention over packed sequences.
///
/// `qkv` f32 [n_tokens, 3 * hidden] holds Q, K and V side by side per token (heads contiguous
/// inside each, `hidden = n_heads * head_dim`). Returns the context f32 [n_tokens, hidden].
pub fn packed_attention_tensor(
    qkv: &Tensor,
    cu_seqlens: &[usize],
    n_heads: usize,
    head_dim: usize,
    bias: Option<&PositionBias>,
) -> Result<Tensor> {
    match qkv.storage() {
        Storage::Cpu(v) => {
            let out = packed_attention(v, cu_seqlens, n_heads, head_dim, bias)?;
            Ok(Tensor::cpu(qkv.rows(), n_heads * head_dim, out))
        }
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => {
            if bias.is_some() {
                return Err(Error::Device(format!(
                    "attention with a relative position bias (MPNet) is not implemented on {} yet",
                    qkv.device()
                )));
            }
            let hidden = n_heads * head_dim;
            if qkv.cols() != 3 * hidden {
                return Err(Error::Shape {
                    op: "attention",
                    reason: format!("qkv rows of {} values, not 3 * {hidden}", qkv.cols()),
                });
            }
            check_cu_seqlens(cu_seqlens, qkv.rows())?;
            let out =
                crate::backend::cuda::attend_packed(&s.dev, &s.buf, cu_seqlens, n_heads, head_dim)?;
            Ok(Tensor::cuda(&s.dev, qkv.rows(), hidden, out))
        }
    }
}

/// [`packed_attention_tensor`] over host rows: `qkv` f32 [n_tokens, 3 * n_heads * head_dim].
pub fn packed_attention(
    qkv: &[f32],
    cu_seqlens: &[usize],
    n_heads: usize,
    head_dim: usize,
    bias: Option<&PositionBias>,
) -> Result<Vec<f32>> {
    let hidden = n_heads * head_dim;
    let stride = 3 * hidden;
    let n_tokens = qkv.len() / stride;
    if qkv.len() != n_tokens * stride {
        return Err(Error::Shape {
            op: "attention",
            reason: format!(
                "qkv has {} values, not a multiple of 3 * {hidden}",
                qkv.len()
            ),
        });
    }
    check_cu_seqlens(cu_seqlens, n_tokens)?;
    if let Some(b) = bias {
        let longest = cu_seqlens
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        if b.max_len < longest || b.values.len() != n_heads * b.max_len * b.max_len {
            return Err(Error::Shape {
                op: "attention",
                reason: format!(
                    "position bias covers {} positions for {n_heads} heads; the longest sequence has {longest}",
                    b.max_len
                ),
            });
        }
    }
    let scale = 1.0 / (head_dim as f32).sqrt();
    let n_seqs = cu_seqlens.len() - 1;
    let tasks: Vec<(usize, usize)> = (0..n_seqs)
        .flat_map(|s| (0..n_heads).map(move |h| (s, h)))
        .filter(|&(s, _)| cu_seqlens[s + 1] > cu_seqlens[s])
        .collect();
    let results: Vec<Vec<f32>> = cpu::par_map(tasks.len(), 1, |t| {
        let (s, h) = tasks[t];
        let start = cu_seqlens[s];
        let len = cu_seqlens[s + 1] - start;
        let base = start * stride + h * head_dim;
        let q = &qkv[base..];
        let k = &qkv[base + hidden..];
        let v = &qkv[base + 2 * hidden..];
        let mut scores = vec![0.0f32; len * len];
        cpu::gemm_bt(
            len,
            len,
            head_dim,
            q,
            stride,
            k,
            stride,
            &mut scores,
            len,
            false,
        );
        cpu::scale(&mut scores, scale);
        for (i, row) in scores.chunks_exact_mut(len).enumerate() {
            if let Some(b) = bias {
                let off = h * b.max_len * b.max_len + i * b.max_len;
                cpu::add_assign(row, &b.values[off..off + len]);
            }
            cpu::softmax(row);
        }
        let mut out = vec![0.0f32; len * head_dim];
        cpu::gemm_nn(
            len, head_dim, len, &scores, len, v, stride, &mut out, head_dim, false,
        );
        out
    });
    let mut context = vec![0.0f32; n_tokens * hidden];
    for (&(s, h), out) in tasks.iter().zip(&results) {
        let start = cu_seqlens[s];
        for (i, row) in out.chunks_exact(head_dim).enumerate() {
            let dst = (start + i) * hidden + h * head_dim;
            context[dst..dst + head_dim].copy_from_slice(row);
        }
    }
    Ok(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Naive per-sequence attention straight from the definition.
    fn reference(qkv: &[f32], cu: &[usize], nh: usize, hd: usize) -> Vec<f32> {
        let hidden = nh * hd;
        let mut out = vec![0.0; qkv.len() / 3];
        for s in 0..cu.len() - 1 {
            for h in 0..nh {
                for i in cu[s]..cu[s + 1] {
                    let q = &qkv[i * 3 * hidden + h * hd..][..hd];
                    let mut w: Vec<f32> = (cu[s]..cu[s + 1])
                        .map(|j| {
                            let k = &qkv[j * 3 * hidden + hidden + h * hd..][..hd];
                            q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() / (hd as f32).sqrt()
                        })
                        .collect();
                    let m = w.iter().cloned().fold(f32::MIN, f32::max);
                    let z: f32 = w
                        .iter_mut()
                        .map(|x| {
                            *x = (*x - m).exp();
                            *x
                        })
                        .sum();
                    for (jj, j) in (cu[s]..cu[s + 1]).enumerate() {
                        let v = &qkv[j * 3 * hidden + 2 * hidden + h * hd..][..hd];
                        for d in 0..hd {
                            out[i * hidden + h * hd + d] += w[jj] / z * v[d];
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_definition_on_ragged_batch() {
        let (nh, hd) = (3, 5);
        let cu = [0, 1, 8, 8, 41];
        let n = 41 * 3 * nh * hd;
        let qkv: Vec<f32> = (0..n)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
            .collect();
        let got = packed_attention(&qkv, &cu, nh, hd, None).unwrap();
        let want = reference(&qkv, &cu, nh, hd);
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn rejects_bad_boundaries() {
        let qkv = vec![0.0; 2 * 3 * 4];
        assert!(packed_attention(&qkv, &[0, 3], 1, 4, None).is_err());
        assert!(packed_attention(&qkv, &[1, 2], 1, 4, None).is_err());
    }
}
