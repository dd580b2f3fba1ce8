//! The gated delta rule of Gated DeltaNet (Qwen3.5's linear-attention layers), per value head:
//!
//! ```text
//! S ← S · exp(g_t)                    decay (g_t ≤ 0)
//! S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)    delta-rule write
//! o_t = Sᵀ q_t
//! ```
//!
//! with `S` the [dk, dv] recurrent state, `q_t`, `k_t` L2-normalized (q also scaled by
//! 1/√dk: [`delta_rule_heads`] does both, as transformers' `use_qk_l2norm_in_kernel`). [`delta_rule_sequential`] runs it token by token (decode);
//! [`delta_rule_chunked`] runs chunks of 64 tokens in the WY (UT-transform) form as matrix
//! products, equal to the sequential form up to rounding, as transformers'
//! `torch_chunk_gated_delta_rule` does. [`delta_rule_heads`] runs a whole layer's heads over
//! one sequence's packed rows (heads in parallel), choosing between the two forms; [`log_decay`]
//! computes its per-token decay.

use std::ops::Range;

use crate::backend::cpu;
use crate::ops::{l2_normalize_rows, put_columns, scale, softplus, take_columns};
use crate::tensor::recycle;

/// Tokens per chunk of the parallel form.
pub const CHUNK: usize = 64;

/// Fewer new tokens than this run the delta rule token by token, more in chunks. Up to
/// [`crate::attention::ROW_BY_ROW`] tokens go token by token, as decode does, so a pass that
/// verifies a speculative draft (or replays a few tokens) computes decode's numbers.
pub const MIN_CHUNKED: usize = crate::attention::ROW_BY_ROW + 1;

/// Head layout of a Gated DeltaNet layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GdnHeads {
    /// Key (and query) heads.
    pub n_k_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub n_v_heads: usize,
    /// Key head width.
    pub k_dim: usize,
    /// Value head width.
    pub v_dim: usize,
    /// Value heads in llama.cpp's tiled order (head `h` reads key head `h % n_k_heads`) instead
    /// of transformers' grouping by key head (`h / (n_v_heads / n_k_heads)`).
    pub v_tiled: bool,
}

impl GdnHeads {
    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.v_tiled {
            h % self.n_k_heads
        } else {
            h / (self.n_v_heads / self.n_k_heads)
        }
    }

    /// Width of a packed query (or key) row: `n_k_heads * k_dim`.
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.k_dim
    }

    /// Width of a packed value (or output) row: `n_v_heads * v_dim`.
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.v_dim
    }

    /// Values in a layer's recurrent state: `n_v_heads` matrices of [k_dim, v_dim].
    pub fn state_len(&self) -> usize {
        self.n_v_heads * self.k_dim * self.v_dim
    }
}

/// One sequence's inputs to a Gated DeltaNet layer over its `n` new tokens, heads packed per
/// token: `qkv` f32 [n, 2·key_dim + value_dim] (queries, keys and values side by side, as the
/// convolution gives them: not yet normalized), `g` (log decay) and `beta` f32 [n, n_v_heads].
#[derive(Debug)]
pub struct GdnInputs<'a> {
    /// Queries, keys and values per token (normalized in place by [`delta_rule_heads`]).
    pub qkv: &'a mut [f32],
    /// Log decay per token and value head.
    pub g: &'a [f32],
    /// Write strength per token and value head.
    pub beta: &'a [f32],
}

/// The log decay `g = −exp(A_log) · softplus(a + dt_bias)` of every token and value head:
/// `a` f32 [n, n_v_heads] (the layer's `a` projection), `a_log_exp` (`exp(A_log)`) and
/// `dt_bias` f32 [n_v_heads]. Returns f32 [n, n_v_heads].
pub fn log_decay(a: &[f32], a_log_exp: &[f32], dt_bias: &[f32]) -> Vec<f32> {
    let nv = a_log_exp.len();
    assert!(
        dt_bias.len() == nv && nv > 0 && a.len().is_multiple_of(nv),
        "log_decay: {} values for {nv} heads",
        a.len()
    );
    let mut g = vec![0.0f32; a.len()];
    for (row, out) in a.chunks_exact(nv).zip(g.chunks_exact_mut(nv)) {
        for (((o, &x), &ae), &dt) in out.iter_mut().zip(row).zip(a_log_exp).zip(dt_bias) {
            *o = -ae * softplus(x + dt);
        }
    }
    g
}

/// The epsilon of the queries' and keys' L2 normalization.
const QK_EPS: f32 = 1e-6;

/// The gated delta rule of every value head of a layer over one sequence's new tokens, heads in
/// parallel (chunked from [`MIN_CHUNKED`] tokens, else token by token), after each key head's
/// queries and keys are L2-normalized and its queries scaled by 1/√dk, in place in `x.qkv`
/// (rows in parallel for prompts); the heads then read their columns where they lie. `state`
/// is the layer's recurrent state f32 [n_v_heads, k_dim, v_dim] before the tokens. Returns the
/// outputs f32 [n, value_dim] (heads packed per token) and the state after them.
pub fn delta_rule_heads(
    x: &mut GdnInputs<'_>,
    heads: &GdnHeads,
    state: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let GdnHeads {
        n_v_heads: nv,
        k_dim: dk,
        v_dim: dv,
        ..
    } = *heads;
    let (kd, vd) = (heads.key_dim(), heads.value_dim());
    let width = 2 * kd + vd;
    let n = x.g.len() / nv.max(1);
    assert!(
        x.qkv.len() == n * width
            && x.g.len() == n * nv
            && x.beta.len() == n * nv
            && state.len() == heads.state_len()
            && dk > 0,
        "delta_rule_heads: inputs do not match {heads:?} over {n} tokens"
    );
    if n == 0 {
        // No tokens (an empty pass): nothing to read, the state as it was.
        return (Vec::new(), state.to_vec());
    }
    let head_cols = |h: usize, d: usize| -> Range<usize> { h * d..(h + 1) * d };
    // Each key head's queries and keys, normalized once (value heads share key heads when
    // there are more of them).
    let q_scale = 1.0 / (dk as f32).sqrt();
    let rows_per_task = (1usize << 14).div_ceil(2 * kd).max(1);
    cpu::par_chunks_mut(x.qkv, rows_per_task * width, n >= MIN_CHUNKED, |_, part| {
        for row in part.chunks_exact_mut(width) {
            let (q, k) = row[..2 * kd].split_at_mut(kd);
            l2_normalize_rows(q, dk, QK_EPS);
            l2_normalize_rows(k, dk, QK_EPS);
            scale(q, q_scale);
        }
    });
    let qkv = &*x.qkv;
    // Each head copies its old state into its share of the new one and advances it there:
    // one pass of copying, spread over the workers.
    let mut new_state = crate::tensor::host_scratch(state.len());
    let mut heads_state: Vec<(usize, &mut [f32])> =
        new_state.chunks_mut(dk * dv).enumerate().collect();
    let outputs = cpu::par_map_mut(&mut heads_state, n * dk * dv >= 1 << 14, |(h, s)| {
        let h = *h;
        s.copy_from_slice(&state[head_cols(h, dk * dv)]);
        let kh = heads.key_head(h);
        let (g, beta) = (
            take_columns(x.g, nv, h..h + 1),
            take_columns(x.beta, nv, h..h + 1),
        );
        let inputs = HeadInputs {
            q: &qkv[kh * dk..],
            k: &qkv[kd + kh * dk..],
            v: &qkv[2 * kd + h * dv..],
            qk_ld: width,
            v_ld: width,
            g: &g,
            beta: &beta,
            dk,
            dv,
        };
        if n >= MIN_CHUNKED {
            delta_rule_chunked(&inputs, s)
        } else {
            delta_rule_sequential(&inputs, s)
        }
    });
    drop(heads_state);
    let mut out = crate::tensor::host_scratch(n * vd);
    for (h, o) in outputs.into_iter().enumerate() {
        put_columns(&mut out, vd, head_cols(h, dv), &o);
        recycle(o);
    }
    (out, new_state)
}

/// One value head's inputs over `n` tokens: `q`, `k` (rows of `dk` values, `qk_ld` apart), `v`
/// (rows of `dv`, `v_ld` apart), `g` (log decay) and `beta` f32 [n].
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a> {
    /// Queries (normalized and scaled).
    pub q: &'a [f32],
    /// Keys (normalized).
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
    /// Distance between the rows of `q` and of `k`.
    pub qk_ld: usize,
    /// Distance between the rows of `v`.
    pub v_ld: usize,
    /// Log decay per token.
    pub g: &'a [f32],
    /// Write strength per token.
    pub beta: &'a [f32],
    /// Key width.
    pub dk: usize,
    /// Value width.
    pub dv: usize,
}

impl HeadInputs<'_> {
    fn n(&self) -> usize {
        self.g.len()
    }
}

/// Token-by-token recurrence: updates `state` f32 [dk, dv] and returns the outputs f32 [n, dv].
pub fn delta_rule_sequential(x: &HeadInputs<'_>, state: &mut [f32]) -> Vec<f32> {
    let (dk, dv, n) = (x.dk, x.dv, x.n());
    let mut out = vec![0.0f32; n * dv];
    let mut mem = vec![0.0f32; dv];
    for t in 0..n {
        let q = &x.q[t * x.qk_ld..][..dk];
        let k = &x.k[t * x.qk_ld..][..dk];
        let v = &x.v[t * x.v_ld..][..dv];
        let decay = x.g[t].exp();
        for s in state.iter_mut() {
            *s *= decay;
        }
        // mem = Sᵀ k
        mem.fill(0.0);
        for (i, &ki) in k.iter().enumerate() {
            for (m, &s) in mem.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                *m += s * ki;
            }
        }
        for (m, &vi) in mem.iter_mut().zip(v) {
            *m = (vi - *m) * x.beta[t];
        }
        // S += k ⊗ delta
        for (i, &ki) in k.iter().enumerate() {
            for (s, &d) in state[i * dv..(i + 1) * dv].iter_mut().zip(&mem) {
                *s += ki * d;
            }
        }
        // o = Sᵀ q
        let o = &mut out[t * dv..(t + 1) * dv];
        for (i, &qi) in q.iter().enumerate() {
            for (o, &s) in o.iter_mut().zip(&state[i * dv..(i + 1) * dv]) {
                *o += s * qi;
            }
        }
    }
    out
}

/// `(I + L)⁻¹` for the strictly lower triangle `L` of `a` f32 [l, l] (its diagonal and upper
/// part are ignored): a unit lower triangular [l, l], by forward substitution on the identity
/// (row `i` is `e_i − Σ_{j<i} L[i][j] · row j`). The solves of a chunk are then two products.
fn unit_lower_inverse(a: &[f32], l: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; l * l];
    for i in 0..l {
        let (done, rest) = t.split_at_mut(i * l);
        let row = &mut rest[..l];
        row[i] = 1.0;
        for (j, &lij) in a[i * l..i * l + i].iter().enumerate() {
            if lij != 0.0 {
                // Row j of the inverse is zero past column j.
                for (r, &x) in row[..=j].iter_mut().zip(&done[j * l..j * l + j + 1]) {
                    *r -= lij * x;
                }
            }
        }
    }
    t
}

/// Chunked parallel form: same result as [`delta_rule_sequential`] (updates `state`, returns
/// f32 [n, dv]), computed per chunk of [`CHUNK`] tokens with matrix products.
pub fn delta_rule_chunked(x: &HeadInputs<'_>, state: &mut [f32]) -> Vec<f32> {
    let (dk, dv, n) = (x.dk, x.dv, x.n());
    // (Every row is written: each chunk's first product overwrites its rows.)
    let mut out = crate::tensor::host_scratch(n * dv);
    // Per-chunk buffers, sized for a whole chunk once (every product overwrites its output).
    // Products that share an operand run as one: [k ⊙ β; q] · kᵀ, (I + A)⁻¹ · [v ⊙ β | k ⊙ β ⊙
    // exp(γ)], and [W; q ⊙ exp(γ)] · S (its right side packed once).
    let c = CHUNK.min(n);
    let vw = dv + dk;
    let mut gamma = vec![0.0f32; c];
    let mut decay = vec![0.0f32; c];
    // Rows [k ⊙ β; q] (2l × dk), and their products with kᵀ: [A; intra] (2l × l).
    let mut kq = vec![0.0f32; 2 * c * dk];
    let mut aq = vec![0.0f32; 2 * c * c];
    // [v ⊙ β | k ⊙ β ⊙ exp(γ)] (l × (dv + dk)).
    let mut vk = vec![0.0f32; c * vw];
    // Rows 0..l: [U | W] = (I + A)⁻¹ · vk; rows l..2l: [· | q ⊙ exp(γ)].
    let mut uw = vec![0.0f32; 2 * c * vw];
    // [W; q ⊙ exp(γ)] · S (2l × dv).
    let mut ws = vec![0.0f32; 2 * c * dv];
    let mut k_dec_t = vec![0.0f32; dk * c];
    let mut c0 = 0;
    while c0 < n {
        let l = CHUNK.min(n - c0);
        // The chunk's rows (`qk_ld` / `v_ld` apart).
        let (ldk, ldv) = (x.qk_ld, x.v_ld);
        let q = &x.q[c0 * ldk..];
        let k = &x.k[c0 * ldk..];
        let v = &x.v[c0 * ldv..];
        let beta = &x.beta[c0..c0 + l];
        // Cumulative log decay within the chunk.
        let gamma = &mut gamma[..l];
        let mut acc = 0.0f32;
        for (gm, &g) in gamma.iter_mut().zip(&x.g[c0..c0 + l]) {
            acc += g;
            *gm = acc;
        }
        let kq = &mut kq[..2 * l * dk];
        scale_rows(kq, dk, k, ldk, dk, beta.iter().copied());
        cpu::copy_rows(q, ldk, &mut kq[l * dk..], dk, l, dk);
        // A = (k_beta · kᵀ) ⊙ exp(γ_i − γ_j) below the diagonal; intra = (q · kᵀ) ⊙ the same
        // decay on and below the diagonal.
        let aq = &mut aq[..2 * l * l];
        cpu::gemm_bt(2 * l, l, dk, kq, dk, k, ldk, aq, l, false);
        let (a, intra) = aq.split_at_mut(l * l);
        for i in 0..l {
            // exp(γ_i − γ_j) for j <= i, in one vector pass per row.
            for (d, &gj) in decay[..=i].iter_mut().zip(gamma.iter()) {
                *d = gamma[i] - gj;
            }
            cpu::exp(&mut decay[..=i]);
            let (ar, qr) = (&mut a[i * l..(i + 1) * l], &mut intra[i * l..(i + 1) * l]);
            for ((x, y), &d) in ar.iter_mut().zip(qr.iter_mut()).zip(&decay[..=i]) {
                *x *= d;
                *y *= d;
            }
            ar[i + 1..].fill(0.0);
            qr[i + 1..].fill(0.0);
        }
        // [U | W] = (I + A)⁻¹ [v ⊙ β | k_beta ⊙ exp(γ)].
        let inv = unit_lower_inverse(a, l);
        let vk = &mut vk[..l * vw];
        scale_rows(vk, vw, v, ldv, dv, beta.iter().copied());
        let k_beta = &kq[..l * dk];
        let exp_gamma = gamma.iter().map(|gm| gm.exp());
        scale_rows(&mut vk[dv..], vw, k_beta, dk, dk, exp_gamma);
        let uw = &mut uw[..2 * l * vw];
        cpu::gemm_nn(l, vw, l, &inv, l, vk, vw, uw, vw, false);
        // Below W: q ⊙ exp(γ), so that [W; q ⊙ exp(γ)] · S is one product.
        let exp_gamma = gamma.iter().map(|gm| gm.exp());
        scale_rows(&mut uw[l * vw + dv..], vw, q, ldk, dk, exp_gamma);
        let ws = &mut ws[..2 * l * dv];
        cpu::gemm_nn(2 * l, dv, dk, &uw[dv..], vw, state, dv, ws, dv, false);
        // v_new = U − W · S (in place of U).
        for (urow, wsrow) in uw.chunks_mut(vw).zip(ws.chunks_exact(dv)).take(l) {
            for (a, &b) in urow[..dv].iter_mut().zip(wsrow) {
                *a -= b;
            }
        }
        let v_new = &uw[..(l - 1) * vw + dv];
        // o = (q ⊙ exp(γ)) · S + intra · v_new
        let o = &mut out[c0 * dv..(c0 + l) * dv];
        o.copy_from_slice(&ws[l * dv..]);
        cpu::gemm_nn(l, dv, l, intra, l, v_new, vw, o, dv, true);
        // S = S · exp(γ_L) + (k ⊙ exp(γ_L − γ))ᵀ · v_new
        let g_last = gamma[l - 1];
        let chunk_decay = g_last.exp();
        for s in state.iter_mut() {
            *s *= chunk_decay;
        }
        // [dk, l]: transposed, each column scaled.
        let k_dec_t = &mut k_dec_t[..dk * l];
        for (j, row) in k.chunks(ldk).take(l).enumerate() {
            let (row, e) = (&row[..dk], (g_last - gamma[j]).exp());
            for (i, &x) in row.iter().enumerate() {
                k_dec_t[i * l + j] = x * e;
            }
        }
        cpu::gemm_nn(dk, dv, l, k_dec_t, l, v_new, vw, state, dv, true);
        c0 += l;
    }
    out
}

/// Row `i` of `dst` (rows `ld` apart, the first `d` values written) = `src` row `i` (rows
/// `src_ld` apart, `d` values read) times the `i`-th factor, for as many rows as `factors` has.
fn scale_rows(
    dst: &mut [f32],
    ld: usize,
    src: &[f32],
    src_ld: usize,
    d: usize,
    factors: impl Iterator<Item = f32>,
) {
    for ((o, row), f) in dst.chunks_mut(ld).zip(src.chunks(src_ld)).zip(factors) {
        for (o, &e) in o[..d].iter_mut().zip(&row[..d]) {
            *o = e * f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: u32, scale: f32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x as f32 / u32::MAX as f32 - 0.5) * scale
            })
            .collect()
    }

    fn normalize_rows(v: &mut [f32], d: usize) {
        for row in v.chunks_exact_mut(d) {
            let n = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            row.iter_mut().for_each(|x| *x /= n);
        }
    }

    #[test]
    fn heads_match_each_head_alone() {
        for v_tiled in [false, true] {
            let heads = GdnHeads {
                n_k_heads: 2,
                n_v_heads: 4,
                k_dim: 8,
                v_dim: 6,
                v_tiled,
            };
            for n in [0, 1, 3, MIN_CHUNKED, 70] {
                let (kd, vd, nv) = (heads.key_dim(), heads.value_dim(), heads.n_v_heads);
                let (q, k, v) = (
                    data(n * kd, 1, 2.0),
                    data(n * kd, 2, 2.0),
                    data(n * vd, 3, 2.0),
                );
                let qkv: Vec<f32> = (0..n)
                    .flat_map(|t| {
                        let (qr, kr) = (&q[t * kd..(t + 1) * kd], &k[t * kd..(t + 1) * kd]);
                        [qr, kr, &v[t * vd..(t + 1) * vd]].concat()
                    })
                    .collect();
                let g: Vec<f32> = data(n * nv, 4, 1.0).iter().map(|x| -x.abs()).collect();
                let beta: Vec<f32> = data(n * nv, 5, 1.0).iter().map(|x| x.abs()).collect();
                let state = data(heads.state_len(), 6, 0.5);
                let mut qkv_in = qkv.clone();
                let mut x = GdnInputs {
                    qkv: &mut qkv_in,
                    g: &g,
                    beta: &beta,
                };
                let (out, new_state) = delta_rule_heads(&mut x, &heads, &state);
                let (dk, dv) = (heads.k_dim, heads.v_dim);
                for h in 0..nv {
                    let key = heads.key_head(h);
                    let col = |s: &[f32], w: usize, c: usize, d: usize| -> Vec<f32> {
                        s.chunks_exact(w)
                            .flat_map(|r| r[c * d..(c + 1) * d].to_vec())
                            .collect()
                    };
                    let (mut qh, mut kh, vh) = (
                        col(&q, kd, key, dk),
                        col(&k, kd, key, dk),
                        col(&v, vd, h, dv),
                    );
                    l2_normalize_rows(&mut qh, dk, QK_EPS);
                    l2_normalize_rows(&mut kh, dk, QK_EPS);
                    scale(&mut qh, 1.0 / (dk as f32).sqrt());
                    let (gh, bh) = (col(&g, nv, h, 1), col(&beta, nv, h, 1));
                    let one = HeadInputs {
                        q: &qh,
                        k: &kh,
                        v: &vh,
                        qk_ld: dk,
                        v_ld: dv,
                        g: &gh,
                        beta: &bh,
                        dk,
                        dv,
                    };
                    let mut s = state[h * dk * dv..(h + 1) * dk * dv].to_vec();
                    let o = if n >= MIN_CHUNKED {
                        delta_rule_chunked(&one, &mut s)
                    } else {
                        delta_rule_sequential(&one, &mut s)
                    };
                    assert_eq!(col(&out, vd, h, dv), o, "n={n} head {h}");
                    assert_eq!(&new_state[h * dk * dv..(h + 1) * dk * dv], &s[..]);
                }
            }
        }
    }

    #[test]
    fn chunked_equals_sequential() {
        for &(n, dk, dv) in &[
            (1, 4, 3),
            (7, 8, 8),
            (64, 16, 8),
            (65, 16, 16),
            (200, 8, 12),
        ] {
            let mut q = data(n * dk, 1, 2.0);
            let mut k = data(n * dk, 2, 2.0);
            normalize_rows(&mut q, dk);
            normalize_rows(&mut k, dk);
            let v = data(n * dv, 3, 2.0);
            let g: Vec<f32> = data(n, 4, 1.0).iter().map(|x| -x.abs() * 0.5).collect();
            let beta: Vec<f32> = data(n, 5, 1.0).iter().map(|x| x.abs() + 0.2).collect();
            let x = HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                qk_ld: dk,
                v_ld: dv,
                g: &g,
                beta: &beta,
                dk,
                dv,
            };
            let init = data(dk * dv, 6, 0.5);
            let (mut s1, mut s2) = (init.clone(), init.clone());
            let o1 = delta_rule_sequential(&x, &mut s1);
            let o2 = delta_rule_chunked(&x, &mut s2);
            for (a, b) in o1.iter().zip(&o2).chain(s1.iter().zip(&s2)) {
                assert!((a - b).abs() < 1e-5, "n={n} dk={dk} dv={dv}: {a} vs {b}");
            }
        }
    }
}

#[cfg(test)]
mod probe {
    use super::*;

    /// Scratch timing (ignored): one Qwen3.5 layer's delta rule over 512 tokens.
    #[test]
    #[ignore]
    fn gdn_probe() {
        let heads = GdnHeads {
            n_k_heads: 16,
            n_v_heads: 16,
            k_dim: 128,
            v_dim: 128,
            v_tiled: false,
        };
        let n = 512;
        let width = 2 * heads.key_dim() + heads.value_dim();
        let qkv: Vec<f32> = (0..n * width)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let g: Vec<f32> = (0..n * 16)
            .map(|i| -(((i * 31) % 100) as f32) / 100.0)
            .collect();
        let beta: Vec<f32> = (0..n * 16)
            .map(|i| ((i * 17) % 100) as f32 / 100.0)
            .collect();
        let state = vec![0.01f32; heads.state_len()];
        for _ in 0..30 {
            let mut qkv_in = qkv.clone();
            let mut x = GdnInputs {
                qkv: &mut qkv_in,
                g: &g,
                beta: &beta,
            };
            let t = std::time::Instant::now();
            let r = delta_rule_heads(&mut x, &heads, &state);
            std::hint::black_box(r);
            eprintln!(
                "delta_rule_heads 512 tokens: {:.2} ms",
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
}
