//! Layers shared by several architectures. [`PostNormLayer`] is the BERT-style encoder layer
//! (attention → residual → LayerNorm → GELU MLP → residual → LayerNorm) that BERT, RoBERTa and
//! MPNet all use under different tensor names.

use crate::attention::{packed_attention_tensor, PositionBias};
use crate::io::store::Scope;
use crate::model::source::{dense_linear, Placement};
use crate::ops::{LayerNorm, Linear};
use crate::tensor::Tensor;
use crate::Result;

/// Where one architecture keeps a [`PostNormLayer`]'s tensors, relative to the layer's scope.
#[derive(Debug, Clone, Copy)]
pub struct LayerNames {
    /// Query projection (e.g. `attention.self.query`).
    pub query: &'static str,
    /// Key projection.
    pub key: &'static str,
    /// Value projection.
    pub value: &'static str,
    /// Attention output projection.
    pub attn_output: &'static str,
    /// LayerNorm after the attention residual.
    pub attn_norm: &'static str,
    /// Feed-forward up projection.
    pub intermediate: &'static str,
    /// Feed-forward down projection.
    pub output: &'static str,
    /// LayerNorm after the feed-forward residual.
    pub output_norm: &'static str,
}

/// Shape of a [`PostNormLayer`].
#[derive(Debug, Clone, Copy)]
pub struct LayerDims {
    /// Hidden width.
    pub hidden: usize,
    /// Feed-forward width.
    pub intermediate: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
}

/// A post-LayerNorm transformer encoder layer with exact-GELU feed-forward.
#[derive(Debug)]
pub struct PostNormLayer {
    qkv: Linear,          // query, key, value fused: f32 [3 * hidden, hidden]
    attn_output: Linear,  // f32 [hidden, hidden]
    attn_norm: LayerNorm, // [hidden]
    intermediate: Linear, // f32 [intermediate, hidden]
    output: Linear,       // f32 [hidden, intermediate]
    output_norm: LayerNorm,
    n_heads: usize,
}

impl PostNormLayer {
    /// Loads a layer from `vb` using `names`, its matrices held and placed as `place` says
    /// (f32 by default; bf16 or Q8_0 when asked).
    pub fn load(
        vb: &Scope,
        names: &LayerNames,
        dims: LayerDims,
        place: &Placement,
    ) -> Result<Self> {
        let (h, i, eps) = (dims.hidden, dims.intermediate, dims.eps);
        let linear = |parts: &[&str], in_dim: usize, out_dim: usize| -> Result<Linear> {
            let mut w = Vec::with_capacity(out_dim * in_dim);
            let mut bias = Vec::with_capacity(out_dim);
            let n = out_dim / parts.len();
            for part in parts {
                let scope = vb.pp(part);
                w.extend_from_slice(scope.get("weight", &[n, in_dim])?.as_slice());
                bias.extend_from_slice(scope.get("bias", &[n])?.as_slice());
            }
            dense_linear(
                place,
                &w,
                out_dim,
                in_dim,
                Some(bias),
                &vb.full_name(parts[0]),
            )
        };
        let qkv = linear(&[names.query, names.key, names.value], h, 3 * h)?;
        Ok(Self {
            qkv,
            attn_output: linear(&[names.attn_output], h, h)?,
            attn_norm: LayerNorm::load(&vb.pp(names.attn_norm), h, eps)?,
            intermediate: linear(&[names.intermediate], h, i)?,
            output: linear(&[names.output], i, h)?,
            output_norm: LayerNorm::load(&vb.pp(names.output_norm), h, eps)?,
            n_heads: dims.n_heads,
        })
    }

    /// `x` [n_tokens, hidden] → same shape, attending within each packed sequence.
    pub fn forward(
        &self,
        x: Tensor,
        cu_seqlens: &[usize],
        bias: Option<&PositionBias>,
    ) -> Result<Tensor> {
        let head_dim = self.attn_output.out_dim() / self.n_heads;
        let qkv = self.qkv.apply(&x)?;
        let context = packed_attention_tensor(&qkv, cu_seqlens, self.n_heads, head_dim, bias)?;
        drop(qkv);
        let mut attn = self.attn_output.apply_residual(&context, x)?;
        self.attn_norm.apply(&mut attn)?;
        let inter = self.intermediate.apply_gelu(&attn)?;
        let mut out = self.output.apply_residual(&inter, attn)?;
        self.output_norm.apply(&mut out)?;
        Ok(out)
    }
}

/// Position ids of a packed batch, RoBERTa / MPNet style: within each sequence, non-padding
/// tokens count up from `pad_id + 1` and padding tokens get `pad_id` (as transformers'
/// `create_position_ids_from_input_ids`). With `pad_id = None` positions are `0, 1, 2, ...`.
pub fn position_ids(ids: &[u32], cu_seqlens: &[usize], pad_id: Option<u32>) -> Vec<usize> {
    let mut out = Vec::with_capacity(ids.len());
    for w in cu_seqlens.windows(2) {
        let mut count = 0usize;
        for &id in &ids[w[0]..w[1]] {
            match pad_id {
                None => {
                    out.push(count);
                    count += 1;
                }
                Some(p) if id == p => out.push(p as usize),
                Some(p) => {
                    count += 1;
                    out.push(p as usize + count);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_ids_restart_per_sequence() {
        let ids = [5, 6, 7, 8, 1, 9];
        let cu = [0, 2, 6];
        assert_eq!(position_ids(&ids, &cu, None), vec![0, 1, 0, 1, 2, 3]);
        assert_eq!(position_ids(&ids, &cu, Some(1)), vec![2, 3, 2, 3, 1, 4]);
    }
}
