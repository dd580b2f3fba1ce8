//! Packing for the blocked GEMM: copies a block of an operand into the contiguous, zero-padded
//! layout the microkernel streams through, and owns the per-thread scratch buffers.
//!
//! Layout ("slivers of width `w`"): sliver `s` is `kc` groups of `w` floats; element `i` of
//! group `p` is operand element (row `s*w + i`, depth `p`). Rows past the edge are zero, so the
//! microkernel never branches on edges in its inner loop. A is always packed this way with
//! `w = MR`; B is packed with `w = NR`, from rows of `B` (for `A·Bᵀ`) or from columns (for `A·B`).

use std::cell::RefCell;

use super::simd::Simd;

/// Packs rows `r0..r0+rows` (each `ld` apart in `src`) at depths `p0..p0+kc` into slivers of
/// `w` rows: `dst[(s*kc + p)*w + i] = src[(r0 + s*w + i)*ld + p0 + p]`, zero past `rows`.
///
/// Done through the vector unit: `LANES × LANES` blocks are loaded row by row,
/// transposed in registers and stored as packed groups (partial groups through masked stores).
/// About four times faster than the scalar loop, which matters because packing `Bᵀ` is
/// repeated on every call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_rows<S: Simd>(
    s: S,
    dst: &mut [f32],
    src: &[f32],
    ld: usize,
    r0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    w: usize,
) {
    let l = S::LANES;
    assert!(l <= MAX_LANES);
    let n_slivers = rows.div_ceil(w);
    for (sl, blk) in dst[..n_slivers * kc * w]
        .chunks_exact_mut(kc * w)
        .enumerate()
    {
        let valid = (rows - sl * w).min(w);
        let first = r0 + sl * w;
        for g in (0..w).step_by(l) {
            let width = (w - g).min(l);
            let live = width.min(valid.saturating_sub(g));
            for pb in (0..kc).step_by(l) {
                let cols = (kc - pb).min(l);
                // Loops over all LANES with the limits as conditions: the trip counts are then
                // constants, the loops unroll and `v` stays in registers.
                let mut v = [s.zero(); MAX_LANES];
                for (i, slot) in v.iter_mut().enumerate().take(S::LANES) {
                    if i < live {
                        let start = (first + g + i) * ld + p0 + pb;
                        *slot = if cols == l {
                            s.load(&src[start..start + l])
                        } else {
                            s.load_part(&src[start..start + cols], 0.0)
                        };
                    }
                }
                s.transpose(&mut v[..l]);
                for (q, &col) in v.iter().enumerate().take(S::LANES) {
                    if q < cols {
                        let o = (pb + q) * w + g;
                        if width == l {
                            s.store(&mut blk[o..], col);
                        } else {
                            s.store_part(&mut blk[o..o + width], col);
                        }
                    }
                }
            }
        }
    }
}

/// The widest vector any [`Simd`] implementation has, in f32 lanes.
const MAX_LANES: usize = 16;

/// Packs columns `c0..c0+cols` at depths (rows) `p0..p0+kc` of a row-major `src` (`ld` apart)
/// into slivers of `w` columns: `dst[(t*kc + p)*w + j] = src[(p0 + p)*ld + c0 + t*w + j]`,
/// zero past `cols`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_cols(
    dst: &mut [f32],
    src: &[f32],
    ld: usize,
    c0: usize,
    cols: usize,
    p0: usize,
    kc: usize,
    w: usize,
) {
    let n_slivers = cols.div_ceil(w);
    for (t, blk) in dst[..n_slivers * kc * w]
        .chunks_exact_mut(kc * w)
        .enumerate()
    {
        let valid = (cols - t * w).min(w);
        for (p, out) in blk.chunks_exact_mut(w).enumerate() {
            let start = (p0 + p) * ld + c0 + t * w;
            out[..valid].copy_from_slice(&src[start..start + valid]);
            out[valid..].fill(0.0);
        }
    }
}

/// Per-thread packing buffers, reused across calls so that small products allocate nothing.
#[derive(Default)]
pub(crate) struct PackBufs {
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Floats of slack so that a buffer can start on a 64-byte boundary.
const ALIGN_FLOATS: usize = 16;

/// The part of `v` (grown to `len` + slack) that starts on a 64-byte boundary, `len` long.
fn aligned(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len + ALIGN_FLOATS {
        v.resize(len + ALIGN_FLOATS, 0.0);
    }
    let misalign = (v.as_ptr() as usize / std::mem::size_of::<f32>()) % ALIGN_FLOATS;
    let off = (ALIGN_FLOATS - misalign) % ALIGN_FLOATS;
    &mut v[off..off + len]
}

thread_local! {
    static BUFS: RefCell<PackBufs> = RefCell::new(PackBufs::default());
}

/// Runs `f` with this thread's A and B packing buffers (64-byte aligned, `a_len` and `b_len`
/// floats). A re-entrant call on the same thread gets fresh buffers instead of panicking.
pub(crate) fn with_bufs<R>(
    a_len: usize,
    b_len: usize,
    f: impl FnOnce(&mut [f32], &mut [f32]) -> R,
) -> R {
    BUFS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut bufs) => {
            let PackBufs { a, b } = &mut *bufs;
            f(aligned(a, a_len), aligned(b, b_len))
        }
        Err(_) => {
            let mut fresh = PackBufs::default();
            f(aligned(&mut fresh.a, a_len), aligned(&mut fresh.b, b_len))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::portable::Portable;
    use super::*;

    /// Scalar reference of [`pack_rows`], one element at a time.
    #[allow(clippy::too_many_arguments)]
    fn pack_rows_ref(
        dst: &mut [f32],
        src: &[f32],
        ld: usize,
        r0: usize,
        rows: usize,
        p0: usize,
        kc: usize,
        w: usize,
    ) {
        let n_slivers = rows.div_ceil(w);
        for (sl, blk) in dst[..n_slivers * kc * w]
            .chunks_exact_mut(kc * w)
            .enumerate()
        {
            let valid = (rows - sl * w).min(w);
            for i in 0..w {
                if i < valid {
                    let start = (r0 + sl * w + i) * ld + p0;
                    let row = &src[start..start + kc];
                    for (out, &v) in blk[i..].iter_mut().step_by(w).zip(row) {
                        *out = v;
                    }
                } else {
                    for out in blk[i..].iter_mut().step_by(w) {
                        *out = 0.0;
                    }
                }
            }
        }
    }

    #[test]
    fn simd_pack_matches_scalar_pack() {
        let (rows, cols) = (37, 29);
        let src: Vec<f32> = (0..rows * cols).map(|v| v as f32).collect();
        for (r0, n, p0, kc, w) in [
            (0usize, 37usize, 0, 29, 12),
            (3, 20, 5, 17, 32),
            (1, 5, 2, 8, 6),
        ] {
            let len = n.div_ceil(w) * kc * w;
            let mut want = vec![-1.0; len];
            let mut got = vec![-2.0; len];
            pack_rows_ref(&mut want, &src, cols, r0, n, p0, kc, w);
            pack_rows(Portable, &mut got, &src, cols, r0, n, p0, kc, w);
            assert_eq!(got, want);
        }
    }

    #[test]
    fn pack_rows_pads_with_zeros() {
        // 3×4 source, pack rows 1..3, depths 1..3, slivers of 4.
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut dst = vec![9.0; 8];
        pack_rows(Portable, &mut dst, &src, 4, 1, 2, 1, 2, 4);
        assert_eq!(dst, [5.0, 9.0, 0.0, 0.0, 6.0, 10.0, 0.0, 0.0]);
    }

    #[test]
    fn pack_cols_pads_with_zeros() {
        let src: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let mut dst = vec![9.0; 8];
        pack_cols(&mut dst, &src, 4, 1, 3, 0, 2, 4);
        assert_eq!(dst, [1.0, 2.0, 3.0, 0.0, 5.0, 6.0, 7.0, 0.0]);
    }
}
