//! The gated delta rule of Gated DeltaNet (Qwen3.5's linear-attention layers), per value head:
//!
//! ```text
//! S ← S · exp(g_t)                    decay (g_t ≤ 0)
//! S ← S + k_t ⊗ β_t (v_t − Sᵀ k_t)    delta-rule write
//! o_t = Sᵀ q_t
//! ```
//!
//! with `S` the [dk, dv] recurrent state, `q_t`, `k_t` L2-normalized (q also scaled by
//! 1/√dk by the caller). [`delta_rule_sequential`] runs it token by token (decode);
//! [`delta_rule_chunked`] runs chunks of 64 tokens in the WY (UT-transform) form as matrix
//! products, equal to the sequential form up to rounding, as transformers'
//! `torch_chunk_gated_delta_rule` does.

use crate::backend::cpu;

/// Tokens per chunk of the parallel form.
pub const CHUNK: usize = 64;

/// One value head's inputs over `n` tokens: `q`, `k` f32 [n, dk], `v` f32 [n, dv], `g` (log
/// decay) and `beta` f32 [n].
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a> {
    /// Queries (normalized and scaled).
    pub q: &'a [f32],
    /// Keys (normalized).
    pub k: &'a [f32],
    /// Values.
    pub v: &'a [f32],
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
        let q = &x.q[t * dk..(t + 1) * dk];
        let k = &x.k[t * dk..(t + 1) * dk];
        let v = &x.v[t * dv..(t + 1) * dv];
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

/// Solves `(I + L) X = B` in place for `X` (`B` f32 [l, w] row-major), where `L` is the strictly
/// lower triangle of `a` f32 [l, l] (its diagonal and upper part are ignored).
fn solve_unit_lower(a: &[f32], l: usize, b: &mut [f32], w: usize) {
    for i in 1..l {
        let (done, rest) = b.split_at_mut(i * w);
        let row = &mut rest[..w];
        for (j, &lij) in a[i * l..i * l + i].iter().enumerate() {
            if lij != 0.0 {
                for (r, &x) in row.iter_mut().zip(&done[j * w..(j + 1) * w]) {
                    *r -= lij * x;
                }
            }
        }
    }
}

/// Chunked parallel form: same result as [`delta_rule_sequential`] (updates `state`, returns
/// f32 [n, dv]), computed per chunk of [`CHUNK`] tokens with matrix products.
pub fn delta_rule_chunked(x: &HeadInputs<'_>, state: &mut [f32]) -> Vec<f32> {
    let (dk, dv, n) = (x.dk, x.dv, x.n());
    let mut out = vec![0.0f32; n * dv];
    let mut c0 = 0;
    while c0 < n {
        let l = CHUNK.min(n - c0);
        let q = &x.q[c0 * dk..(c0 + l) * dk];
        let k = &x.k[c0 * dk..(c0 + l) * dk];
        let v = &x.v[c0 * dv..(c0 + l) * dv];
        let beta = &x.beta[c0..c0 + l];
        // Cumulative log decay within the chunk.
        let mut gamma = vec![0.0f32; l];
        let mut acc = 0.0f32;
        for (gm, &g) in gamma.iter_mut().zip(&x.g[c0..c0 + l]) {
            acc += g;
            *gm = acc;
        }
        let k_beta: Vec<f32> = k
            .chunks_exact(dk)
            .zip(beta)
            .flat_map(|(row, &b)| row.iter().map(move |&e| e * b))
            .collect();
        // A = (k_beta · kᵀ) ⊙ exp(γ_i − γ_j) below the diagonal; intra = (q · kᵀ) ⊙ the same
        // decay on and below the diagonal.
        let mut a = vec![0.0f32; l * l];
        cpu::gemm_bt(l, l, dk, &k_beta, dk, k, dk, &mut a, l, false);
        let mut intra = vec![0.0f32; l * l];
        cpu::gemm_bt(l, l, dk, q, dk, k, dk, &mut intra, l, false);
        for i in 0..l {
            for j in 0..l {
                if j <= i {
                    let d = (gamma[i] - gamma[j]).exp();
                    a[i * l + j] *= d;
                    intra[i * l + j] *= d;
                } else {
                    a[i * l + j] = 0.0;
                    intra[i * l + j] = 0.0;
                }
            }
        }
        // U = (I + A)⁻¹ (v ⊙ β); W = (I + A)⁻¹ (k_beta ⊙ exp(γ)).
        let mut u: Vec<f32> = v
            .chunks_exact(dv)
            .zip(beta)
            .flat_map(|(row, &b)| row.iter().map(move |&e| e * b))
            .collect();
        solve_unit_lower(&a, l, &mut u, dv);
        let mut w: Vec<f32> = k_beta
            .chunks_exact(dk)
            .zip(&gamma)
            .flat_map(|(row, &gm)| {
                let e = gm.exp();
                row.iter().map(move |&x| x * e)
            })
            .collect();
        solve_unit_lower(&a, l, &mut w, dk);
        // v_new = U − W · S
        let mut ws = vec![0.0f32; l * dv];
        cpu::gemm_nn(l, dv, dk, &w, dk, state, dv, &mut ws, dv, false);
        let v_new: Vec<f32> = u.iter().zip(&ws).map(|(a, b)| a - b).collect();
        // o = (q ⊙ exp(γ)) · S + intra · v_new
        let q_dec: Vec<f32> = q
            .chunks_exact(dk)
            .zip(&gamma)
            .flat_map(|(row, &gm)| {
                let e = gm.exp();
                row.iter().map(move |&x| x * e)
            })
            .collect();
        let o = &mut out[c0 * dv..(c0 + l) * dv];
        cpu::gemm_nn(l, dv, dk, &q_dec, dk, state, dv, o, dv, false);
        cpu::gemm_nn(l, dv, l, &intra, l, &v_new, dv, o, dv, true);
        // S = S · exp(γ_L) + (k ⊙ exp(γ_L − γ))ᵀ · v_new
        let g_last = gamma[l - 1];
        let chunk_decay = g_last.exp();
        for s in state.iter_mut() {
            *s *= chunk_decay;
        }
        let k_dec_t = {
            // [dk, l]: transposed, each column scaled.
            let mut t = vec![0.0f32; dk * l];
            for (j, row) in k.chunks_exact(dk).enumerate() {
                let e = (g_last - gamma[j]).exp();
                for (i, &x) in row.iter().enumerate() {
                    t[i * l + j] = x * e;
                }
            }
            t
        };
        cpu::gemm_nn(dk, dv, l, &k_dec_t, l, &v_new, dv, state, dv, true);
        c0 += l;
    }
    out
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
