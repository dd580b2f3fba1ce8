//! Randomized Hadamard rotations for QuaRot: `Q = D · H / √n` with `D` a seeded random ±1
//! diagonal and `H` a Hadamard matrix of order `n = m · 2^k` — Sylvester's `2^k` times a Paley
//! matrix of order `m` (`q + 1` for a prime `q ≡ 3 mod 4`, `2(q + 1)` for a prime `q ≡ 1 mod 4`,
//! or 1). That covers the widths of the models here (896 = 28 · 32, 2560 = 20 · 128,
//! 4864 = 76 · 64, powers of two). `Q` is orthogonal, so a residual stream rotated by it keeps
//! its norms and the model's function, while outliers spread over every coordinate.
//!
//! Rows are rotated in `O(n (log 2^k + m))` (a fast Walsh-Hadamard transform per `2^k` block,
//! then the `m × m` Paley matrix across blocks), in f64.

/// A randomized Hadamard rotation of order `n`.
#[derive(Debug, Clone)]
pub struct Rotation {
    n: usize,
    /// Sylvester block size `2^k`.
    pow2: usize,
    /// The Paley factor, ±1, `m × m` row-major (`[1]` when `m = 1`).
    paley: Vec<f64>,
    m: usize,
    signs: Vec<f64>,
}

impl Rotation {
    /// The rotation of order `n` with signs drawn from `seed`; `None` when `n` is not `m · 2^k`
    /// for a Paley order `m` this module constructs.
    pub fn new(n: usize, seed: u64) -> Option<Self> {
        let mut pow2 = 1;
        let mut best = None;
        // Prefer the largest power of two (the cheapest factorization).
        while n.is_multiple_of(pow2) {
            let m = n / pow2;
            if let Some(p) = paley(m) {
                best = Some((pow2, m, p));
            }
            pow2 *= 2;
        }
        let (pow2, m, paley) = best?;
        let mut s = seed ^ 0x9E37_79B9_7F4A_7C15;
        let signs = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                if s & 1 == 0 {
                    1.0
                } else {
                    -1.0
                }
            })
            .collect();
        Some(Self {
            n,
            pow2,
            paley,
            m,
            signs,
        })
    }

    /// Order.
    pub fn n(&self) -> usize {
        self.n
    }

    /// `x ← x · Q` for a row `x` of length `n`.
    pub fn rotate_row(&self, x: &mut [f64]) {
        assert_eq!(x.len(), self.n, "Rotation::rotate_row: row length");
        for (v, s) in x.iter_mut().zip(&self.signs) {
            *v *= s;
        }
        // x · (A ⊗ B): B (Sylvester, symmetric) within each block of 2^k, then A across blocks.
        for block in x.chunks_exact_mut(self.pow2) {
            fwht(block);
        }
        if self.m > 1 {
            let mut out = vec![0.0f64; self.n];
            for a in 0..self.m {
                let src = &x[a * self.pow2..(a + 1) * self.pow2];
                for a2 in 0..self.m {
                    let h = self.paley[a * self.m + a2];
                    let dst = &mut out[a2 * self.pow2..(a2 + 1) * self.pow2];
                    for (d, &v) in dst.iter_mut().zip(src) {
                        *d += h * v;
                    }
                }
            }
            x.copy_from_slice(&out);
        }
        let norm = 1.0 / (self.n as f64).sqrt();
        for v in x.iter_mut() {
            *v *= norm;
        }
    }

    /// `W ← W · Q` for `w` [rows, n] row-major (f32 in and out, f64 inside).
    pub fn rotate_rows(&self, w: &mut [f32]) {
        let mut row = vec![0.0f64; self.n];
        for r in w.chunks_exact_mut(self.n) {
            for (d, &v) in row.iter_mut().zip(r.iter()) {
                *d = f64::from(v);
            }
            self.rotate_row(&mut row);
            for (d, &v) in r.iter_mut().zip(&row) {
                *d = v as f32;
            }
        }
    }

    /// `W ← Qᵀ · W` for `w` [n, cols] row-major: each column rotated as a row.
    pub fn rotate_columns(&self, w: &mut [f32], cols: usize) {
        assert_eq!(w.len(), self.n * cols, "Rotation::rotate_columns: shape");
        let mut col = vec![0.0f64; self.n];
        for c in 0..cols {
            for (i, d) in col.iter_mut().enumerate() {
                *d = f64::from(w[i * cols + c]);
            }
            self.rotate_row(&mut col);
            for (i, &v) in col.iter().enumerate() {
                w[i * cols + c] = v as f32;
            }
        }
    }
}

/// In-place unnormalized fast Walsh-Hadamard transform (Sylvester order `x.len()`, a power of 2).
fn fwht(x: &mut [f64]) {
    let mut h = 1;
    while h < x.len() {
        for i in (0..x.len()).step_by(2 * h) {
            for j in i..i + h {
                let (a, b) = (x[j], x[j + h]);
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
        h *= 2;
    }
}

fn is_prime(q: usize) -> bool {
    q >= 2
        && (2..)
            .take_while(|d| d * d <= q)
            .all(|d| !q.is_multiple_of(d))
}

/// The quadratic character of `x` modulo the prime `q` (0, 1 or −1).
fn chi(x: usize, q: usize) -> f64 {
    let x = x % q;
    if x == 0 {
        0.0
    } else if (1..q).any(|y| y * y % q == x) {
        1.0
    } else {
        -1.0
    }
}

/// A Hadamard matrix of order `m` by Paley's constructions (or `[1]`), row-major ±1.
fn paley(m: usize) -> Option<Vec<f64>> {
    if m == 1 {
        return Some(vec![1.0]);
    }
    // Paley I: q = m − 1 prime, q ≡ 3 (mod 4). H = I + S, S = [[0, 1ᵀ], [−1, Q]].
    if m >= 4 && is_prime(m - 1) && (m - 1) % 4 == 3 {
        let q = m - 1;
        let mut h = vec![0.0; m * m];
        for i in 0..m {
            for j in 0..m {
                let s = match (i, j) {
                    (0, 0) => 0.0,
                    (0, _) => 1.0,
                    (_, 0) => -1.0,
                    _ => chi(j + q - i, q),
                };
                h[i * m + j] = s + if i == j { 1.0 } else { 0.0 };
            }
        }
        return Some(h);
    }
    // Paley II: q = m/2 − 1 prime, q ≡ 1 (mod 4). C = [[0, 1ᵀ], [1, Q]] (symmetric conference
    // matrix of order q + 1); H = C ⊗ [[1, 1], [1, −1]] + I ⊗ [[1, −1], [−1, −1]].
    if m.is_multiple_of(2) && m >= 6 && is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1 {
        let (q, c) = (m / 2 - 1, m / 2);
        let conf = |i: usize, j: usize| match (i, j) {
            (0, 0) => 0.0,
            (0, _) | (_, 0) => 1.0,
            _ => chi(j + q - i, q),
        };
        let mut h = vec![0.0; m * m];
        for i in 0..c {
            for j in 0..c {
                let (cv, id) = (conf(i, j), if i == j { 1.0 } else { 0.0 });
                for (a, b) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                    let k = if (a, b) == (1, 1) { -1.0 } else { 1.0 };
                    let e = if (a, b) == (0, 0) { 1.0 } else { -1.0 };
                    h[(2 * i + a) * m + 2 * j + b] = cv * k + id * e;
                }
            }
        }
        return Some(h);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(r: &Rotation) -> Vec<f64> {
        let n = r.n();
        let mut q = vec![0.0; n * n];
        for i in 0..n {
            let mut e = vec![0.0; n];
            e[i] = 1.0;
            r.rotate_row(&mut e);
            q[i * n..(i + 1) * n].copy_from_slice(&e);
        }
        q
    }

    #[test]
    fn paley_matrices_are_hadamard() {
        for m in [1, 4, 8, 12, 20, 24, 28, 36, 44, 60, 76] {
            let h = paley(m).unwrap_or_else(|| panic!("no Paley matrix of order {m}"));
            for i in 0..m {
                for j in 0..m {
                    let dot: f64 = (0..m).map(|k| h[i * m + k] * h[j * m + k]).sum();
                    let want = if i == j { m as f64 } else { 0.0 };
                    assert_eq!(dot, want, "order {m}, rows {i}, {j}");
                }
            }
        }
        assert!(paley(19).is_none() && paley(16).is_none());
    }

    #[test]
    fn rotations_are_orthogonal_for_model_widths() {
        for n in [64, 96, 112, 896, 1152] {
            let r = Rotation::new(n, 3).unwrap_or_else(|| panic!("no rotation of order {n}"));
            let q = dense(&r);
            for i in (0..n).step_by(7) {
                for j in (0..n).step_by(5) {
                    let dot: f64 = (0..n).map(|k| q[i * n + k] * q[j * n + k]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-12, "order {n}: ({i}, {j}) = {dot}");
                }
            }
        }
        for n in [2560, 4864, 4096] {
            assert!(Rotation::new(n, 0).is_some(), "order {n}");
        }
        assert!(Rotation::new(19 * 2, 0).is_none());
    }

    #[test]
    fn columns_rotate_by_the_transpose() {
        // (Qᵀ W)ᵀ = Wᵀ Q: rotating columns equals rotating the transpose's rows.
        let r = Rotation::new(12, 9).unwrap();
        let cols = 3;
        let w: Vec<f32> = (0..12 * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut by_cols = w.clone();
        r.rotate_columns(&mut by_cols, cols);
        let mut t: Vec<f32> = (0..cols * 12)
            .map(|i| w[(i % 12) * cols + i / 12])
            .collect();
        r.rotate_rows(&mut t);
        for i in 0..12 {
            for c in 0..cols {
                assert!((by_cols[i * cols + c] - t[c * 12 + i]).abs() < 1e-6);
            }
        }
    }
}
