//! LoRA's low-rank updates on a GPU: `y += s · B (A x)` with every row of a product taking its
//! own factor pairs (the BGMV form of the CPU backend's `cpu::add_low_rank`), so two launches
//! (`A x` in slices of the inputs, then the slices' sums times `B`) serve a batch whatever
//! adapters its rows pick. Each row's list of pairs is a step input of
//! its own per product (keyed by the caller), so a recorded decode step replays it. The
//! product's input mode (RMSNorm, SwiGLU) is applied to the rows as the kernel reads them, so a
//! layer with adapters keeps its fused product.

use cudarc::driver::LaunchConfig;

use super::{Buf, CudaDevice, GemvInput, Input};
use crate::{Error, Result};

/// The fewest outputs a block of `low_rank_expand` updates.
const MIN_COLS_PER_BLOCK: usize = 256;
/// Inputs per block of `low_rank_shrink` (kernels.cu `LOW_RANK_SLICE`).
const SLICE: usize = 256;
/// Rank components per block of `low_rank_shrink` (kernels.cu `LOW_RANK_CHUNK`).
const CHUNK: usize = 16;

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
    /// `y[i] += Σ_t t.scale · (t.a v[i]) · t.bt` over the terms `rows[i]` of every row `i` of
    /// `y` [m, out_dim], where `v` [m, in_dim] is `x` with `input` applied (x [m, 2 in_dim] for
    /// SwiGLU); `key` names the product (its row lists are kept as a step input of their own).
    #[allow(clippy::too_many_arguments)] // the product's operands, its input mode and key
    pub fn add_low_rank(
        &self,
        x: &Buf,
        in_dim: usize,
        input: GemvInput<'_>,
        y: &mut Buf,
        out_dim: usize,
        rows: &[Vec<LowRankTerm<'_>>],
        key: (u64, usize),
    ) -> Result<()> {
        let m = rows.len();
        let (norm_w, eps, swiglu) = self.input_args(input, x, m, in_dim);
        assert!(y.len() >= m * out_dim);
        if m == 0 || out_dim == 0 {
            return Ok(());
        }
        // Each row's first term (m + 1 offsets, padded to 8 bytes), then the terms: the
        // addresses of A and Bᵀ, rank, outputs, first column, scale, row, first rank component
        // in the partial sums (kernels.cu `LowRankTerm`).
        let header = (m + 2) & !1;
        let terms: usize = rows.iter().map(Vec::len).sum();
        if terms == 0 {
            return Ok(());
        }
        let mut work: Vec<u32> = Vec::with_capacity(header + 10 * terms);
        let mut first = 0u32;
        for r in rows {
            work.push(first);
            first += r.len() as u32;
        }
        work.push(first);
        work.resize(header, 0);
        let (mut total_rank, mut max_rank) = (0usize, 0usize);
        for (row, t) in rows
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.iter().map(move |t| (i, t)))
        {
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
            work.extend([row as u32, total_rank as u32]);
            total_rank += t.rank;
            max_rank = max_rank.max(t.rank);
        }
        let pw = self.input(Input::LowRank(key.0, key.1), &work)?;
        let slices = in_dim.div_ceil(SLICE);
        let mut part = self.alloc_buf(slices * total_rank)?;
        let (px, pp) = (self.ptr(x), self.mptr(&mut part));
        let (k, rows32, total32) = (in_dim as i32, m as i32, total_rank as i32);
        let mut b = self.args(&self.kernels().low_rank_shrink);
        b.arg(&px)
            .arg(&k)
            .arg(&pw)
            .arg(&rows32)
            .arg(&pp)
            .arg(&total32);
        b.arg(&norm_w).arg(&eps).arg(&swiglu);
        let cfg = LaunchConfig {
            grid_dim: (terms as u32, slices as u32, max_rank.div_ceil(CHUNK) as u32),
            block_dim: (SLICE as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (e, s, c) reads term e (checked above: A holds rank · in_dim values),
        // inputs s · SLICE.. of its row of x (checked by `input_args` to hold m rows of its
        // mode's width) and the norm weight [in_dim] when given, and writes its rank chunk's
        // partial sums of slice s, inside `part` [slices, total_rank].
        unsafe { self.go(&mut b, cfg, "low_rank_shrink") }?;
        // Column tiles per row: about two blocks per multiprocessor in all.
        let tiles = (2 * self.sms)
            .div_ceil(m)
            .clamp(1, out_dim.div_ceil(MIN_COLS_PER_BLOCK));
        let cols = out_dim.div_ceil(tiles);
        let py = self.mptr(y);
        let pp = self.ptr(&part);
        let (n, slices32, cols32) = (out_dim as i32, slices as i32, cols as i32);
        let mut b = self.args(&self.kernels().low_rank_expand);
        b.arg(&py)
            .arg(&n)
            .arg(&pw)
            .arg(&rows32)
            .arg(&pp)
            .arg(&slices32);
        b.arg(&total32).arg(&cols32);
        let cfg = LaunchConfig {
            grid_dim: (m as u32, out_dim.div_ceil(cols) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: block (r, c) reads row r's terms, their partial sums and Bᵀ (checked above
        // to hold rank · n values) and writes row r's outputs of column tile c of y.
        unsafe { self.go(&mut b, cfg, "add_low_rank") }
    }
}
