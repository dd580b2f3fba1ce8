//! Low-rank updates of a product's rows: LoRA's `y += s · B (A x)` with every row taking its
//! own factors (the BGMV form), so one pass serves a batch whatever adapters its rows pick.
//!
//! Each rank component is a dot product with the row (`A`'s row) and a scaled add of one row
//! of `Bᵀ` into the outputs, so the kernel streams each factor once per row with the SIMD dot
//! and axpy kernels; factors shared by several rows stay in cache between them.

use super::{kernels, par_chunks_mut};

/// One factor pair applied to one row: `y[col..col + n] += scale · Bᵀᵀ (A x)`.
#[derive(Clone, Copy, Debug)]
pub struct Delta<'a> {
    /// `A` [rank, in_dim], row-major.
    pub a: &'a [f32],
    /// `Bᵀ` [rank, n], row-major (rank component `r`'s weights for the `n` outputs).
    pub bt: &'a [f32],
    /// Rows of `A` (and of `Bᵀ`).
    pub rank: usize,
    /// First output column the `n` outputs add to.
    pub col: usize,
    /// Multiplies the update.
    pub scale: f32,
}

impl Delta<'_> {
    fn outputs(&self) -> usize {
        self.bt.len() / self.rank.max(1)
    }
}

/// `y[i] += Σ_d d.scale · (d.a x[i]) · d.bt` over the deltas `rows[i]` of every row `i` of
/// `x` [m, in_dim] and `y` [m, out_dim]. Rows are spread over the worker threads; a batch of
/// fewer rows than threads splits each row's outputs instead.
pub fn add_low_rank(x: &[f32], in_dim: usize, y: &mut [f32], out_dim: usize, rows: &[Vec<Delta>]) {
    let m = rows.len();
    assert_eq!(
        x.len(),
        m * in_dim,
        "add_low_rank: x is not [{m}, {in_dim}]"
    );
    assert_eq!(
        y.len(),
        m * out_dim,
        "add_low_rank: y is not [{m}, {out_dim}]"
    );
    for d in rows.iter().flatten() {
        assert!(
            d.a.len() == d.rank * in_dim
                && d.bt.len() == d.rank * d.outputs()
                && d.col + d.outputs() <= out_dim,
            "add_low_rank: a factor does not fit the product"
        );
    }
    let work: usize = rows.iter().flatten().map(|d| d.a.len() + d.bt.len()).sum();
    if work == 0 || out_dim == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let parallel = threads > 1 && work >= 1 << 15;
    let pieces = if parallel && m < threads {
        threads.div_ceil(m)
    } else {
        1
    };
    let width = out_dim.div_ceil(pieces).max(1);
    let k = kernels();
    par_chunks_mut(y, width, parallel, |c, chunk| {
        // A chunk is a run of output columns, possibly crossing into the next row.
        let mut t = Vec::new();
        let (start, end) = (c * width, c * width + chunk.len());
        let mut pos = start;
        while pos < end {
            let (i, c0) = (pos / out_dim, pos % out_dim);
            let c1 = (c0 + end - pos).min(out_dim);
            let out = &mut chunk[pos - start..pos - start + (c1 - c0)];
            let xr = &x[i * in_dim..(i + 1) * in_dim];
            for d in &rows[i] {
                let n = d.outputs();
                let (lo, hi) = (d.col.max(c0), (d.col + n).min(c1));
                if lo >= hi {
                    continue;
                }
                t.clear();
                t.extend(d.a.chunks_exact(in_dim).map(|a| d.scale * k.dot(a, xr)));
                for (&tr, bt) in t.iter().zip(d.bt.chunks_exact(n)) {
                    if tr != 0.0 {
                        k.axpy(&mut out[lo - c0..hi - c0], tr, &bt[lo - d.col..hi - d.col]);
                    }
                }
            }
            pos += c1 - c0;
        }
    });
}
