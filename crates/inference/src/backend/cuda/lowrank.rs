//! LoRA's low-rank updates on a GPU: `y += s · B (A x)` with every row of a product taking its
//! own factor pairs (the BGMV form of the CPU backend's `cpu::add_low_rank`), so one launch
//! serves a batch whatever adapters its rows pick. Each row's list of pairs is a step input of
//! its own per product (keyed by the caller), so a recorded decode step replays it.

use cudarc::driver::LaunchConfig;

use super::{Buf, CudaDevice, Input};
use crate::{Error, Result};

/// Outputs one block of `add_low_rank` updates (kernels.cu `LOW_RANK_COLS`).
const COLS_PER_BLOCK: usize = 1024;

/// One factor pair applied to one row (see `cpu::Delta`): device copies (f32) of `A`
/// [rank, in_dim] and `Bᵀ` [rank, n]; the row's outputs `col..col + n` gain `scale · Bᵀᵀ (A x)`.
#[derive(Debug, Clone, Copy)]
pub struct LowRankTerm<'a> {
    /// `A` [rank, in_dim].
    pub a: &'a Buf,
    /// `Bᵀ` [rank, n].
    pub bt: &'a Buf,
    /// Rows of `A` and of `Bᵀ`.
    pub rank: usize,
    /// First output column.
    pub col: usize,
    /// Multiplies the update.
    pub scale: f32,
}

impl LowRankTerm<'_> {
    fn outputs(&self) -> usize {
        self.bt.len() / self.rank.max(1)
    }
}

impl CudaDevice {
    /// `y[i] += Σ_t t.scale · (t.a x[i]) · t.bt` over the terms `rows[i]` of every row `i` of
    /// `x` [m, in_dim] and `y` [m, out_dim]; `key` names the product (its row lists are kept
    /// as a step input of their own).
    pub fn add_low_rank(
        &self,
        x: &Buf,
        in_dim: usize,
        y: &mut Buf,
        out_dim: usize,
        rows: &[Vec<LowRankTerm<'_>>],
        key: (u64, usize),
    ) -> Result<()> {
        let m = rows.len();
        assert!(x.len() >= m * in_dim && y.len() >= m * out_dim);
        if m == 0 || out_dim == 0 {
            return Ok(());
        }
        // Each row's first term (m + 1 offsets, padded to 8 bytes), then the terms: the
        // addresses of A and Bᵀ, rank, outputs, first column, scale (kernels.cu `LowRankTerm`).
        let header = (m + 2) & !1;
        let terms: usize = rows.iter().map(Vec::len).sum();
        let mut work: Vec<u32> = Vec::with_capacity(header + 8 * terms);
        let mut first = 0u32;
        for r in rows {
            work.push(first);
            first += r.len() as u32;
        }
        work.push(first);
        work.resize(header, 0);
        for t in rows.iter().flatten() {
            let n = t.outputs();
            if t.rank == 0
                || t.a.len() < t.rank * in_dim
                || t.bt.len() != t.rank * n
                || t.col + n > out_dim
            {
                return Err(Error::Shape {
                    op: "add_low_rank",
                    reason: format!(
                        "a factor pair of rank {} ({} and {} values) does not fit a product of \
                         {in_dim} inputs and {out_dim} outputs at column {}",
                        t.rank,
                        t.a.len(),
                        t.bt.len(),
                        t.col
                    ),
                });
            }
            for p in [self.ptr(t.a), self.ptr(t.bt)] {
                work.extend([p as u32, (p >> 32) as u32]);
            }
            work.extend([t.rank as u32, n as u32, t.col as u32, t.scale.to_bits()]);
        }
        let pw = self.input(Input::LowRank(key.0, key.1), &work)?;
        let (px, py) = (self.ptr(x), self.mptr(y));
        let (k, n, rows32) = (in_dim as i32, out_dim as i32, m as i32);
        let mut b = self.args(&self.kernels().add_low_rank);
        b.arg(&px).arg(&k).arg(&py).arg(&n).arg(&pw).arg(&rows32);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, out_dim.div_ceil(COLS_PER_BLOCK) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (r, c) reads row r of x, the terms' factors (checked above to hold
        // rank · in_dim and rank · n values) and writes row r's outputs of column tile c of y.
        unsafe { self.go(&mut b, cfg, "add_low_rank") }
    }
}
