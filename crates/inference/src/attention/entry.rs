//! [`attend`]: the one entry point decoder models call for causal attention over their
//! sequences' states. It writes the new rows' keys and values into each state and picks the
//! kernel from the batch, not from the model: one decode pass over every (sequence, key/value
//! head) when each sequence brings a single row (or a few: a verified draft, row by row), the
//! tiled causal kernel per sequence otherwise.

use crate::ops::{RmsNorm, Rope};
use crate::state::SeqState;
use crate::tensor::{Storage, Tensor};
use crate::{Error, Result};

use super::causal::{cached_attention, cached_decode_batch, decode_attention_views, CausalShape};

/// Attention of the new rows of every sequence of a batch over its state's attention layer
/// `layer`, after appending their keys and values to it.
///
/// `q` f32 [rows, n_heads * head_dim], `k` and `v` f32 [rows, n_kv_heads * head_dim], the rows
/// of sequence `i` (`seq_lens[i]` of them) after those of the sequences before it, already
/// normalized and rotated. Returns the context f32 [rows, n_heads * head_dim] in row order.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let (q_dim, kv_dim) = (
        shape.n_heads * shape.head_dim,
        shape.n_kv_heads * shape.head_dim,
    );
    let rows: usize = seq_lens.iter().sum();
    if q.len() != rows * q_dim || k.len() != rows * kv_dim || v.len() != rows * kv_dim {
        return Err(Error::Shape {
            op: "attend",
            reason: format!(
                "{rows} rows: q has {} values (rows of {q_dim}), k {} and v {} (rows of {kv_dim})",
                q.len(),
                k.len(),
                v.len()
            ),
        });
    }
    if seq_lens.len() != states.len() {
        return Err(Error::Shape {
            op: "attend",
            reason: format!("{} sequences, {} states", seq_lens.len(), states.len()),
        });
    }
    let mut row0 = 0;
    for (&n, state) in seq_lens.iter().zip(states.iter_mut()) {
        let r = row0 * kv_dim..(row0 + n) * kv_dim;
        state.append(layer, &k[r.clone()], &v[r]);
        row0 += n;
    }
    if crate::metrics::enabled() {
        let views: Vec<&SeqState> = states.iter().map(|s| &**s).collect();
        crate::metrics::report_attention_entropy(mean_entropy(
            q, seq_lens, &views, layer, shape, scale,
        ));
    }
    if seq_lens.iter().all(|&n| n == 1) {
        let views: Vec<&SeqState> = states.iter().map(|s| &**s).collect();
        return cached_decode_batch(q, &views, layer, shape, scale);
    }
    if seq_lens.iter().all(|&n| n <= ROW_BY_ROW) {
        let views: Vec<_> = seq_lens
            .iter()
            .zip(states.iter())
            .flat_map(|(&n, s)| row_views(s, layer, n))
            .collect();
        return decode_attention_views(q, &views, shape, scale);
    }
    let mut ctx = Vec::with_capacity(rows * q_dim);
    let mut row0 = 0;
    for (&n, state) in seq_lens.iter().zip(states.iter()) {
        let q = &q[row0 * q_dim..(row0 + n) * q_dim];
        ctx.extend(if n <= ROW_BY_ROW {
            decode_attention_views(q, &row_views(state, layer, n), shape, scale)?
        } else {
            cached_attention(q, state, layer, shape, scale)?
        });
        row0 += n;
    }
    Ok(ctx)
}

/// The mean entropy of the attention distributions of every head of every new row (the
/// layer metrics; a second pass over the keys, taken only when they are observed).
fn mean_entropy(
    q: &[f32],
    seq_lens: &[usize],
    states: &[&SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> f64 {
    let (hd, nh) = (shape.head_dim, shape.n_heads);
    let group = nh / shape.n_kv_heads.max(1);
    let kv_dim = shape.n_kv_heads * hd;
    let (mut sum, mut count) = (0.0f64, 0usize);
    let mut row0 = 0;
    for (&n, state) in seq_lens.iter().zip(states) {
        let keys = state.keys(layer);
        let total = keys.rows();
        let k = keys.gather_f32(0..total);
        for r in 0..n {
            let t = total - n + r;
            let lo = shape
                .sliding_window
                .map_or(0, |w| (t + 1).saturating_sub(w));
            let qr = &q[(row0 + r) * nh * hd..(row0 + r + 1) * nh * hd];
            for h in 0..nh {
                let qh = &qr[h * hd..(h + 1) * hd];
                let kh = (h / group) * hd;
                let scores: Vec<f32> = (lo..=t)
                    .map(|j| {
                        let kj = &k[j * kv_dim + kh..j * kv_dim + kh + hd];
                        scale * qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>()
                    })
                    .collect();
                sum += crate::metrics::softmax_entropy(&scores);
                count += 1;
            }
        }
        row0 += n;
    }
    sum / count.max(1) as f64
}

/// Sequences of at most this many new rows attend row by row with the decode kernel, so a
/// row's numbers do not depend on the rows that came with it: a speculative draft verified in
/// one pass gets the logits decode steps would have given, bit for bit (the tiled kernel
/// sums in another order).
pub const ROW_BY_ROW: usize = 16;

/// The keys and values each of a sequence's `n` new rows (the last rows of its state) sees:
/// row r those up to and including itself.
fn row_views<'a>(
    state: &'a SeqState,
    layer: usize,
    n: usize,
) -> Vec<(crate::state::KvView<'a>, crate::state::KvView<'a>)> {
    let (k, v) = (state.keys(layer), state.values(layer));
    let total = k.rows();
    (0..n)
        .map(|r| {
            let upto = total - n + r + 1;
            (k.prefix(upto), v.prefix(upto))
        })
        .collect()
}

/// [`attend`] on tensors, on the device they (and the states' pages) live on.
#[allow(clippy::too_many_arguments)]
pub fn attend_tensors(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Tensor> {
    let rows = q.rows();
    let q_dim = shape.n_heads * shape.head_dim;
    match (q.storage(), k.storage(), v.storage()) {
        (Storage::Cpu(q), Storage::Cpu(k), Storage::Cpu(v)) => Ok(Tensor::cpu(
            rows,
            q_dim,
            attend(q, k, v, seq_lens, states, layer, shape, scale)?,
        )),
        #[cfg(feature = "cuda")]
        (Storage::Cuda(qs), Storage::Cuda(ks), Storage::Cuda(vs)) => {
            let kv_dim = shape.n_kv_heads * shape.head_dim;
            if q.cols() != q_dim
                || (k.rows(), k.cols()) != (rows, kv_dim)
                || (v.rows(), v.cols()) != (rows, kv_dim)
                || seq_lens.iter().sum::<usize>() != rows
                || seq_lens.len() != states.len()
            {
                return Err(Error::Shape {
                    op: "attend",
                    reason: format!(
                        "q {:?}, k {:?}, v {:?} for sequences of {seq_lens:?} tokens ({} states)",
                        (q.rows(), q.cols()),
                        (k.rows(), k.cols()),
                        (v.rows(), v.cols()),
                        states.len()
                    ),
                });
            }
            let out = crate::backend::cuda::attend_paged(
                &qs.dev, &qs.buf, &ks.buf, &vs.buf, seq_lens, states, layer, shape, scale,
            )?;
            Ok(Tensor::cuda(&qs.dev, rows, q_dim, out))
        }
        #[cfg(feature = "cuda")]
        _ => Err(crate::tensor::mixed("attend")),
    }
}

/// How a layer's queries and keys are prepared before attention: optional per-head RMSNorm of
/// queries and keys (Qwen3), then RoPE at `positions`.
#[derive(Clone, Copy)]
pub struct QkvHeads<'a> {
    /// Per-head query and key norms (both or neither).
    pub norms: Option<(&'a RmsNorm, &'a RmsNorm)>,
    /// The rotary embedding.
    pub rope: &'a Rope,
    /// Position of every row.
    pub positions: &'a [usize],
    /// 3-D positions of every row (multimodal rotary embeddings), when the batch has them.
    pub positions_3d: Option<&'a [[usize; 3]]>,
}

/// Attention from a layer's fused Q/K/V product `qkv` [rows, (n_heads + 2 n_kv_heads) *
/// head_dim]: split into heads, `heads` applied to queries and keys, then [`attend_tensors`].
/// On a GPU the split, norms, rotation and KV write are one kernel.
#[allow(clippy::too_many_arguments)]
pub fn attend_qkv(
    qkv: &Tensor,
    heads: &QkvHeads<'_>,
    seq_lens: &[usize],
    states: &mut [&mut SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Tensor> {
    let (hd, rows) = (shape.head_dim, qkv.rows());
    let (q_dim, kv_dim) = (shape.n_heads * hd, shape.n_kv_heads * hd);
    if qkv.cols() != q_dim + 2 * kv_dim
        || heads.positions.len() != rows
        || heads.rope.head_dim() != hd
    {
        return Err(Error::Shape {
            op: "attend_qkv",
            reason: format!(
                "qkv [{rows}, {}] for {} + 2 x {kv_dim} columns, {} positions, rope heads of {}",
                qkv.cols(),
                q_dim,
                heads.positions.len(),
                heads.rope.head_dim()
            ),
        });
    }
    match qkv.storage() {
        #[cfg(feature = "cuda")]
        Storage::Cuda(s) => {
            if heads
                .positions_3d
                .is_some_and(|p| p.iter().any(|x| x[0] != x[1] || x[1] != x[2]))
            {
                return Err(Error::Device(
                    "multimodal (3-D) rotary positions do not run on the GPU yet".into(),
                ));
            }
            let norms = match heads.norms {
                Some((qn, kn)) => {
                    Some((qn.cuda_weight(&s.dev)?, kn.cuda_weight(&s.dev)?, qn.eps()))
                }
                None => None,
            };
            let positions: Vec<i32> = heads.positions.iter().map(|&p| p as i32).collect();
            let prep = crate::backend::cuda::QkvPrep {
                inv_freq: heads.rope.cuda_inv_freq(&s.dev)?,
                attn: heads.rope.attention_scaling(),
                norms,
                positions: &positions,
            };
            if seq_lens.iter().sum::<usize>() != rows || seq_lens.len() != states.len() {
                return Err(Error::Shape {
                    op: "attend_qkv",
                    reason: format!(
                        "{rows} rows for sequences of {seq_lens:?} ({} states)",
                        states.len()
                    ),
                });
            }
            let out = crate::backend::cuda::attend_qkv_paged(
                &s.dev, &s.buf, &prep, seq_lens, states, layer, shape, scale,
            )?;
            Ok(Tensor::cuda(&s.dev, rows, q_dim, out))
        }
        Storage::Cpu(_) => {
            let [mut q, mut k, v] = qkv.split_columns([q_dim, kv_dim, kv_dim])?;
            if let Some((qn, kn)) = heads.norms {
                q = q.reshape(rows * shape.n_heads, hd)?;
                k = k.reshape(rows * shape.n_kv_heads, hd)?;
                qn.apply(&mut q)?;
                kn.apply(&mut k)?;
                q = q.reshape(rows, q_dim)?;
                k = k.reshape(rows, kv_dim)?;
            }
            match heads.positions_3d {
                Some(p3) => {
                    heads.rope.rotate_3d(&mut q, shape.n_heads, p3)?;
                    heads.rope.rotate_3d(&mut k, shape.n_kv_heads, p3)?;
                }
                None => {
                    heads.rope.rotate(&mut q, shape.n_heads, heads.positions)?;
                    heads
                        .rope
                        .rotate(&mut k, shape.n_kv_heads, heads.positions)?;
                }
            }
            attend_tensors(&q, &k, &v, seq_lens, states, layer, shape, scale)
        }
    }
}
