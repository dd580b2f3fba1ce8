//! Low-rank updates of a product's rows: LoRA's `y += s · B (A x)` with every row taking its
//! own factors (the BGMV form), so one pass serves a batch whatever adapters its rows pick.
//!
//! Each rank component is a dot product with the row (`A`'s row) and a scaled add of one row
//! of `Bᵀ` into the outputs, so the kernel streams each factor once per row with the SIMD dot
//! and axpy kernels; factors shared by several rows stay in cache between them.

use super::{kernels, par_chunks_mut, Kernels};

/// A factor's values: f32, or bf16 (its bits) widened to f32 in registers, exactly.
#[derive(Clone, Copy, Debug)]
pub enum Values<'a> {
    /// f32.
    F32(&'a [f32]),
    /// bf16 bits.
    Bf16(&'a [u16]),
}

impl<'a> Values<'a> {
    fn len(&self) -> usize {
        match self {
            Self::F32(v) => v.len(),
            Self::Bf16(v) => v.len(),
        }
    }

    fn slice(&self, r: std::ops::Range<usize>) -> Values<'a> {
        match self {
            Self::F32(v) => Self::F32(&v[r]),
            Self::Bf16(v) => Self::Bf16(&v[r]),
        }
    }

    fn dot(&self, k: &Kernels, x: &[f32]) -> f32 {
        match self {
            Self::F32(v) => k.dot(v, x),
            Self::Bf16(v) => k.dot_bf16(v, x),
        }
    }

    /// `y += c · self`.
    fn add_scaled_to(&self, k: &Kernels, y: &mut [f32], c: f32) {
        match self {
            Self::F32(v) => k.axpy(y, c, v),
            Self::Bf16(v) => k.axpy_bf16(y, c, v),
        }
    }
}

/// One factor pair applied to one row: `y[col..col + n] += scale · Bᵀᵀ (A x)`.
#[derive(Clone, Copy, Debug)]
pub struct Delta<'a> {
    /// `A` [rank, in_dim], row-major.
    pub a: Values<'a>,
    /// `Bᵀ` [rank, n], row-major (rank component `r`'s weights for the `n` outputs).
    pub bt: Values<'a>,
    /// Rows of `A` (and of `Bᵀ`).
    pub rank: usize,
    /// First output column the `n` outputs add to.
    pub col: usize,
    /// Multiplies the update.
    pub scale: f32,
}

impl<'a> AsRef<Delta<'a>> for Delta<'a> {
    fn as_ref(&self) -> &Delta<'a> {
        self
    }
}

impl Delta<'_> {
    fn outputs(&self) -> usize {
        self.bt.len() / self.rank.max(1)
    }
}

/// `y[i] += Σ_d d.scale · (d.a x[i]) · d.bt` over the deltas `rows[i]` of every row `i` of
/// `x` [m, in_dim] and `y` [m, out_dim]. Rows are spread over the worker threads; a batch of
/// fewer rows than threads splits each row's outputs instead.
pub fn add_low_rank<'a, D: AsRef<Delta<'a>> + Sync>(
    x: &[f32],
    in_dim: usize,
    y: &mut [f32],
    out_dim: usize,
    rows: &[Vec<D>],
) {
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
    for d in rows.iter().flatten().map(AsRef::as_ref) {
        assert!(
            d.a.len() == d.rank * in_dim
                && d.bt.len() == d.rank * d.outputs()
                && d.col + d.outputs() <= out_dim,
            "add_low_rank: a factor does not fit the product"
        );
    }
    let work: usize = rows
        .iter()
        .flatten()
        .map(|d| d.as_ref().a.len() + d.as_ref().bt.len())
        .sum();
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
            for d in rows[i].iter().map(AsRef::as_ref) {
                let n = d.outputs();
                let (lo, hi) = (d.col.max(c0), (d.col + n).min(c1));
                if lo >= hi {
                    continue;
                }
                t.clear();
                t.extend(
                    (0..d.rank)
                        .map(|r| d.scale * d.a.slice(r * in_dim..(r + 1) * in_dim).dot(k, xr)),
                );
                for (r, &tr) in t.iter().enumerate() {
                    if tr != 0.0 {
                        let bt = d.bt.slice(r * n + lo - d.col..r * n + hi - d.col);
                        bt.add_scaled_to(k, &mut out[lo - c0..hi - c0], tr);
                    }
                }
            }
            pos += c1 - c0;
        }
    });
}
