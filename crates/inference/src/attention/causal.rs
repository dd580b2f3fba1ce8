//! Causal (decoder) attention of new tokens over a sequence's cached keys and values, with
//! grouped-query heads (several query heads share one key/value head) and an optional sliding
//! window.
//!
//! Query rows are processed in tiles, and each tile only multiplies against the keys it may
//! see, so a prompt of `n` tokens costs about `n² / 2` dot products rather than `n²`.
//!
//! One new token (decode) takes a fused path instead: per key/value head, the kernel
//! `backend::cpu::attn` scores all the query heads of the group while each key row is in L1,
//! so every cached row is read from memory once per step, in place from the cache's pages
//! (f32 or f16), never copied.

use crate::backend::cpu;
use crate::backend::cpu::attn::{self, DecodeGroup};
use crate::state::{KvRows, KvView, SeqState};
use crate::{Error, Result};

/// Query rows per tile: bounds the score buffer and the work wasted above the diagonal.
const QUERY_TILE: usize = 64;

/// Below this many multiply-adds per product the heads run on the calling thread.
const SERIAL_WORK: usize = 1 << 16;

/// Head layout of a causal attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CausalShape {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads; divides `n_heads`.
    pub n_kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// When set, a token sees only the last `window` positions (itself included).
    pub sliding_window: Option<usize>,
}

/// [`causal_attention`] over the cache of attention layer `layer` of `state` (which already
/// holds the new tokens' rows), whatever its [`KvDtype`](crate::state::KvDtype) and paging.
///
/// One new token reads the cached pages in place ([`decode_attention_views`]); several attend
/// over an f32 copy of the rows they can see (from the sliding-window start of the first
/// query; prompt processing is compute bound, the copy is small beside it).
pub fn cached_attention(
    q: &[f32],
    state: &SeqState,
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let (keys, values) = (state.keys(layer), state.values(layer));
    let q_dim = shape.n_heads * shape.head_dim;
    if q.len() == q_dim {
        return decode_attention_views(q, &[(keys, values)], shape, scale);
    }
    let total = keys.rows().min(values.rows());
    // Rows before the window of the first query are seen by no query; shapes that do not add
    // up gather everything and are rejected by `causal_attention`.
    let first = match (q.len().checked_div(q_dim), shape.sliding_window) {
        (Some(n), Some(w)) if q.len().is_multiple_of(q_dim) && n <= total => {
            (total - n + 1).saturating_sub(w.max(1))
        }
        _ => 0,
    };
    let (k, v) = (
        keys.gather_f32(first..keys.rows()),
        values.gather_f32(first..values.rows()),
    );
    causal_attention(q, &k, &v, shape, scale)
}

/// Checks the layout and returns `(queries, cached rows)`.
fn check(q: usize, keys: usize, values: usize, shape: &CausalShape) -> Result<(usize, usize)> {
    let CausalShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        ..
    } = *shape;
    let q_dim = n_heads * hd;
    let kv_dim = n_kv_heads * hd;
    let bad = |reason: String| {
        Err(Error::Shape {
            op: "causal attention",
            reason,
        })
    };
    if n_kv_heads == 0 || hd == 0 || n_heads % n_kv_heads != 0 {
        return bad(format!(
            "{n_heads} query heads cannot share {n_kv_heads} key/value heads of {hd} features"
        ));
    }
    if !q.is_multiple_of(q_dim) || !keys.is_multiple_of(kv_dim) || keys != values {
        return bad(format!(
            "q has {q} values (rows of {q_dim}), keys {keys} and values {values} (rows of {kv_dim})"
        ));
    }
    let n = q / q_dim;
    let total = keys / kv_dim;
    if n > total {
        return bad(format!("{n} queries but only {total} cached keys"));
    }
    Ok((n, total))
}

/// Attention of one new token (the last cached row) over the visible cached rows, `q` f32
/// [n_heads * head_dim]. See [`decode_attention_batch`].
pub fn decode_attention(
    q: &[f32],
    keys: KvRows<'_>,
    values: KvRows<'_>,
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    decode_attention_batch(q, &[(keys, values)], shape, scale)
}

/// [`decode_attention_views`] over attention layer `layer` of each state (which already holds
/// its sequence's new row), whatever their [`KvDtype`](crate::state::KvDtype)s and paging.
pub fn cached_decode_batch(
    q: &[f32],
    states: &[&SeqState],
    layer: usize,
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let caches: Vec<_> = states
        .iter()
        .map(|s| (s.keys(layer), s.values(layer)))
        .collect();
    decode_attention_views(q, &caches, shape, scale)
}

/// [`decode_attention_views`] over contiguous caches: `(keys, values)` of sequence `i`, each
/// f32 or f16 [rows, n_kv_heads * head_dim].
pub fn decode_attention_batch(
    q: &[f32],
    caches: &[(KvRows<'_>, KvRows<'_>)],
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let q_dim = shape.n_heads * shape.head_dim;
    let kv_dim = shape.n_kv_heads * shape.head_dim;
    let mut views = Vec::with_capacity(caches.len());
    for (k, v) in caches {
        check(q_dim, k.len(), v.len(), shape)?;
        views.push((
            KvView::contiguous(*k, kv_dim),
            KvView::contiguous(*v, kv_dim),
        ));
    }
    decode_attention_views(q, &views, shape, scale)
}

/// Attention of one new token per sequence: `q` f32 [n_seqs, n_heads * head_dim], row `i`
/// against the cached `(keys, values)` views of sequence `i` (rows of n_kv_heads * head_dim,
/// its new token's row last; f32 or f16, in pages or not), read in place.
/// Returns f32 [n_seqs, n_heads * head_dim].
///
/// One task per (sequence, key/value head), run on the pool when the work is large; each task
/// reads its head's cached rows once for all the query heads of its group.
pub fn decode_attention_views(
    q: &[f32],
    caches: &[(KvView<'_>, KvView<'_>)],
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let CausalShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        sliding_window,
    } = *shape;
    let q_dim = n_heads * hd;
    let kv_dim = n_kv_heads * hd;
    let bad = |reason: String| {
        Err(Error::Shape {
            op: "decode attention",
            reason,
        })
    };
    if q.len() != caches.len() * q_dim {
        return bad(format!(
            "q has {} values for {} sequences of {q_dim}",
            q.len(),
            caches.len()
        ));
    }
    // The layout of the heads (one query against one row), then each view against it.
    check(q_dim, kv_dim, kv_dim, shape)?;
    let mut first = Vec::with_capacity(caches.len());
    let window = sliding_window.unwrap_or(usize::MAX).max(1);
    for (k, v) in caches {
        if k.ld() != kv_dim || v.ld() != kv_dim {
            return bad(format!(
                "rows of {} keys and {} values for {n_kv_heads} heads of {hd}",
                k.ld(),
                v.ld()
            ));
        }
        if k.rows() != v.rows() || k.is_empty() {
            return bad(format!("{} cached keys and {} values", k.rows(), v.rows()));
        }
        if k.is_f16() != v.is_f16() {
            return bad("keys and values are stored in different types".into());
        }
        first.push(k.rows().saturating_sub(window));
    }
    let group = n_heads / n_kv_heads;
    let mut out = vec![0.0f32; q.len()];
    let task = |(t, o): (usize, &mut [f32])| {
        let (i, g) = (t / n_kv_heads, t % n_kv_heads);
        let dg = DecodeGroup {
            g: group,
            hd,
            first: first[i],
            col: g * hd,
            scale,
        };
        let qg = &q[t * group * hd..(t + 1) * group * hd];
        let (k, v) = &caches[i];
        attn::decode_group(&dg, qg, k, v, &mut Vec::new(), o);
    };
    // Short contexts: one task (spreading a few microseconds of work costs more than it saves).
    let work: usize = caches
        .iter()
        .zip(&first)
        .map(|((k, _), &f)| (k.rows() - f) * q_dim)
        .sum();
    cpu::par_chunks_mut(&mut out, group * hd, work >= SERIAL_WORK, |i, c| {
        task((i, c))
    });
    Ok(out)
}

/// Attention of `n` new tokens, at positions `past..past + n`, over all `past + n` cached tokens.
///
/// `q` f32 [n, n_heads * head_dim]; `keys`/`values` f32 [past + n, n_kv_heads * head_dim] (the
/// new tokens' rows last); scores are scaled by `scale`. Returns f32 [n, n_heads * head_dim].
pub fn causal_attention(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    shape: &CausalShape,
    scale: f32,
) -> Result<Vec<f32>> {
    let (n, total) = check(q.len(), keys.len(), values.len(), shape)?;
    if n == 1 {
        return decode_attention(q, KvRows::F32(keys), KvRows::F32(values), shape, scale);
    }
    let CausalShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        sliding_window,
    } = *shape;
    let q_dim = n_heads * hd;
    let kv_dim = n_kv_heads * hd;
    let past = total - n;
    let group = n_heads / n_kv_heads;
    let window = sliding_window.unwrap_or(usize::MAX).max(1);
    // Keys visible to the query at position p: lo(p)..=p.
    let lo = |p: usize| (p + 1).saturating_sub(window);
    let min_len = if n * total * q_dim < SERIAL_WORK {
        n_heads
    } else {
        1
    };
    let results: Vec<Vec<f32>> = cpu::par_map(n_heads, min_len, |h| {
        let g = h / group;
        // (Every row is written: each query tile's product overwrites its rows.)
        let mut o = crate::tensor::host_scratch(n * hd);
        let mut s = Vec::new();
        for b0 in (0..n).step_by(QUERY_TILE) {
            let b1 = (b0 + QUERY_TILE).min(n);
            let rows = b1 - b0;
            // Keys any row of this tile may see.
            let k0 = lo(past + b0);
            let k1 = past + b1;
            let len = k1 - k0;
            s.clear();
            s.resize(rows * len, 0.0);
            cpu::gemm_bt(
                rows,
                len,
                hd,
                &q[b0 * q_dim + h * hd..],
                q_dim,
                &keys[k0 * kv_dim + g * hd..],
                kv_dim,
                &mut s,
                len,
                false,
            );
            for (r, row) in s.chunks_exact_mut(len).enumerate() {
                let p = past + b0 + r;
                let (a, z) = (lo(p) - k0, p + 1 - k0);
                row[..a].fill(0.0);
                row[z..].fill(0.0);
                let visible = &mut row[a..z];
                cpu::scale(visible, scale);
                cpu::softmax(visible);
            }
            cpu::gemm_nn(
                rows,
                hd,
                len,
                &s,
                len,
                &values[k0 * kv_dim + g * hd..],
                kv_dim,
                &mut o[b0 * hd..],
                hd,
                false,
            );
        }
        o
    });
    let mut out = crate::tensor::host_scratch(n * q_dim);
    for (h, o) in results.into_iter().enumerate() {
        crate::ops::put_columns(&mut out, q_dim, h * hd..(h + 1) * hd, &o);
        crate::tensor::recycle(o);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(q: &[f32], k: &[f32], v: &[f32], s: &CausalShape, scale: f32) -> Vec<f32> {
        let (hd, qd, kd) = (
            s.head_dim,
            s.n_heads * s.head_dim,
            s.n_kv_heads * s.head_dim,
        );
        let n = q.len() / qd;
        let total = k.len() / kd;
        let past = total - n;
        let w = s.sliding_window.unwrap_or(usize::MAX);
        let mut out = vec![0.0; q.len()];
        for i in 0..n {
            let p = past + i;
            for h in 0..s.n_heads {
                let g = h / (s.n_heads / s.n_kv_heads);
                let js: Vec<usize> = (0..=p).filter(|&j| p - j < w).collect();
                let sc: Vec<f64> = js
                    .iter()
                    .map(|&j| {
                        (0..hd)
                            .map(|d| q[i * qd + h * hd + d] as f64 * k[j * kd + g * hd + d] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = sc.iter().map(|x| (x - m).exp()).sum();
                for d in 0..hd {
                    out[i * qd + h * hd + d] = js
                        .iter()
                        .zip(&sc)
                        .map(|(&j, x)| (x - m).exp() / z * v[j * kd + g * hd + d] as f64)
                        .sum::<f64>() as f32;
                }
            }
        }
        out
    }

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104729) % 2000) as f32 / 1000.0) - 1.0)
            .collect()
    }

    #[test]
    fn matches_definition() {
        for &(nh, nkv, hd) in &[(4, 2, 8), (3, 1, 5), (2, 2, 16)] {
            for &window in &[None, Some(1), Some(5)] {
                for &(past, n) in &[(0, 1), (0, 7), (6, 1), (5, 70), (0, 130), (33, 2)] {
                    let s = CausalShape {
                        n_heads: nh,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        sliding_window: window,
                    };
                    let q = data(n * nh * hd, 1);
                    let k = data((past + n) * nkv * hd, 2);
                    let v = data((past + n) * nkv * hd, 3);
                    let got = causal_attention(&q, &k, &v, &s, 0.3).unwrap();
                    let want = reference(&q, &k, &v, &s, 0.3);
                    for (a, b) in got.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{nh}/{nkv}/{hd} {window:?} {past}+{n}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }

    /// The prefill path copies only the rows from the first query's window start; the result
    /// must still be the definition's, with and without a window, and decode alike.
    #[test]
    fn cached_attention_matches_definition() {
        let (nh, nkv, hd) = (4, 2, 8);
        let kv = nkv * hd;
        for window in [None, Some(1), Some(5), Some(30)] {
            let s = CausalShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                sliding_window: window,
            };
            for (past, n) in [(20, 6), (0, 9), (40, 1)] {
                let k = data((past + n) * kv, 2);
                let v = data((past + n) * kv, 3);
                let mut st = SeqState::new(1, kv, 64);
                st.append(0, &k[..past * kv], &v[..past * kv]);
                st.commit(past);
                st.append(0, &k[past * kv..], &v[past * kv..]);
                let q = data(n * nh * hd, 1);
                let got = cached_attention(&q, &st, 0, &s, 0.3).unwrap();
                let want = reference(&q, &k, &v, &s, 0.3);
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() < 1e-5, "{window:?} {past}+{n}: {a} vs {b}");
                }
            }
        }
    }

    /// Decode over pages of 32 rows (window starts mid-page) equals decode over the same rows
    /// in one buffer.
    #[test]
    fn paged_decode_equals_contiguous() {
        let (nh, nkv, hd) = (14, 2, 64);
        let kv = nkv * hd;
        let totals = [1, 40, 300];
        let ks: Vec<Vec<f32>> = (0..3).map(|i| data(totals[i] * kv, 2 + i)).collect();
        let vs: Vec<Vec<f32>> = (0..3).map(|i| data(totals[i] * kv, 5 + i)).collect();
        let q = data(3 * nh * hd, 1);
        fn pages(x: &[f32], rows: usize, ld: usize) -> KvView<'_> {
            KvView::new(x.chunks(32 * ld).map(KvRows::F32).collect(), 32, rows, ld)
        }
        for window in [None, Some(77)] {
            let s = CausalShape {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
                sliding_window: window,
            };
            let flat: Vec<_> = (0..3)
                .map(|i| (KvRows::F32(&ks[i]), KvRows::F32(&vs[i])))
                .collect();
            let want = decode_attention_batch(&q, &flat, &s, 0.125).unwrap();
            let views: Vec<_> = (0..3)
                .map(|i| (pages(&ks[i], totals[i], kv), pages(&vs[i], totals[i], kv)))
                .collect();
            let got = decode_attention_views(&q, &views, &s, 0.125).unwrap();
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                    "{window:?}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let s = CausalShape {
            n_heads: 3,
            n_kv_heads: 2,
            head_dim: 4,
            sliding_window: None,
        };
        assert!(causal_attention(&[0.0; 12], &[0.0; 8], &[0.0; 8], &s, 1.0).is_err());
        let s = CausalShape { n_kv_heads: 1, ..s };
        let (k, v16) = ([0.0f32; 8], [half::f16::ZERO; 8]);
        let wide = KvView::contiguous(KvRows::F32(&k), 8);
        let narrow = KvView::contiguous(KvRows::F32(&k), 4);
        let h16 = KvView::contiguous(KvRows::F16(&v16), 4);
        let q = [0.0; 12];
        assert!(decode_attention_views(&q, &[(wide.clone(), wide)], &s, 1.0).is_err());
        assert!(decode_attention_views(&q, &[(narrow.clone(), h16)], &s, 1.0).is_err());
        assert!(decode_attention_views(&q[..4], &[(narrow.clone(), narrow)], &s, 1.0).is_err());
    }
}
