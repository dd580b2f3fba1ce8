//! The innermost GEMM loops, generic over [`Simd`]: the register-blocked microkernel that the
//! blocked driver (`gemm.rs`) calls on packed panels, and the unpacked dot-product kernel used
//! when one side of the product is only a few rows.
//!
//! These functions take raw pointers because they sit below the bounds checks: `gemm.rs`
//! checks every slice once per call and then hands out pointers that stay in bounds. The
//! packing layouts they read are described in `pack.rs`.

use super::simd::Simd;

/// Panel rows ahead of the one being multiplied that the microkernel asks the cache for.
const PREFETCH_ROWS: usize = 16;

/// What a B panel holds: f32, or bf16 bits widened to f32 as they load (the same products).
pub(crate) trait PanelValue: Copy {
    /// Loads `LANES` values at `p` as f32.
    ///
    /// # Safety
    /// `p..p + LANES` must be readable.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::V;
}

impl PanelValue for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f32) -> S::V {
        // SAFETY: forwarded caller contract.
        unsafe { s.load_ptr(p) }
    }
}

impl PanelValue for u16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const u16) -> S::V {
        // SAFETY: forwarded caller contract.
        unsafe { s.load_bf16_ptr(p) }
    }
}

/// `C[m×nr] (+)= Â · B̂` for one register tile, `M` rows by `NV·LANES` columns.
///
/// `(a, astep, arow)` holds A's `M` rows: row `i` of step `p` at `a[p*astep + i*arow]` (a
/// packed sliver of groups of `astep >= M` floats with `arow = 1`, or the rows where they lie
/// in A, `astep = 1` and `arow` = A's row stride; the packed form gets a loop of its own with
/// constant offsets, so its tiles need no register per row). `b` is a B panel: `kc` rows of
/// `NV·LANES` values (f32, or bf16 widened as they load), `ldb` apart. Only the first `nr`
/// columns of `C` are read or written (partial vectors go through masked loads and stores);
/// with `accumulate` the product is added to `C`.
///
/// # Safety
/// `a[p*astep + i*arow]` and `b[p*ldb .. p*ldb + NV*LANES]` for `p < kc`, `i < M` must be
/// readable, `c[i*ldc .. i*ldc + nr]` for `i < M` readable and writable, and
/// `nr <= NV*LANES`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn tile<S: Simd, B: PanelValue, const M: usize, const NV: usize>(
    s: S,
    kc: usize,
    (a, astep, arow): (*const f32, usize, usize),
    b: *const B,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    accumulate: bool,
) {
    let a = (a, astep, arow);
    // SAFETY: forwarded caller contract.
    let acc = unsafe {
        if arow == 1 {
            products::<S, B, M, NV, true>(s, kc, a, b, ldb)
        } else {
            products::<S, B, M, NV, false>(s, kc, a, b, ldb)
        }
    };
    // SAFETY: forwarded caller contract.
    unsafe { store_tile::<S, M, NV>(s, &acc, c, ldc, nr, accumulate) }
}

/// The tile's accumulators: `Σ_p a[p*astep + i*arow] · b[p*ldb ..]` (`PACKED`: `arow` is 1,
/// offsets known at compile time).
///
/// # Safety
/// As [`tile`]'s A and B.
#[inline(always)]
unsafe fn products<S: Simd, B: PanelValue, const M: usize, const NV: usize, const PACKED: bool>(
    s: S,
    kc: usize,
    (a, astep, arow): (*const f32, usize, usize),
    b: *const B,
    ldb: usize,
) -> [[S::V; NV]; M] {
    let arow = if PACKED { 1 } else { arow };
    let mut acc = [[s.zero(); NV]; M];
    let mut ap = a;
    let mut bp = b;
    // The same bytes ahead for f32 and bf16 panels: twice the rows for bf16.
    let ahead = PREFETCH_ROWS * 4 / std::mem::size_of::<B>();
    for _ in 0..kc {
        let mut bv = [s.zero(); NV];
        for (v, slot) in bv.iter_mut().enumerate() {
            // SAFETY: row p of the B panel holds NV·LANES readable floats (caller contract).
            *slot = unsafe { B::load(s, bp.add(v * S::LANES)) };
            // The panel row `ahead` rows on (the hardware prefetcher alone leaves a one-row
            // product short of the memory bandwidth).
            s.prefetch(bp.wrapping_add(ahead * ldb + v * S::LANES));
        }
        for (i, row) in acc.iter_mut().enumerate() {
            // SAFETY: the step's M values of A are readable (caller contract).
            let ai = s.splat(unsafe { *ap.add(i * arow) });
            for (r, bb) in row.iter_mut().zip(&bv) {
                *r = s.mul_add(ai, *bb, *r);
            }
        }
        // SAFETY: advancing within (or one past) the buffers described by the caller contract.
        unsafe {
            ap = ap.add(astep);
            bp = bp.add(ldb);
        }
    }
    acc
}

/// Stores (or adds) the tile's accumulators into the first `nr` columns of `M` rows of C.
///
/// # Safety
/// As [`tile`]'s C.
#[inline(always)]
unsafe fn store_tile<S: Simd, const M: usize, const NV: usize>(
    s: S,
    acc: &[[S::V; NV]; M],
    c: *mut f32,
    ldc: usize,
    nr: usize,
    accumulate: bool,
) {
    let full = nr == NV * S::LANES;
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: row i < M of C is in bounds for nr columns (caller contract).
        let cr = unsafe { c.add(i * ldc) };
        for (v, r) in row.iter().enumerate() {
            let col = v * S::LANES;
            if full {
                // SAFETY: a full tile has LANES valid columns at `col`.
                unsafe {
                    let out = if accumulate {
                        s.add(*r, s.load_ptr(cr.add(col)))
                    } else {
                        *r
                    };
                    s.store_ptr(cr.add(col), out);
                }
            } else if col < nr {
                let cnt = (nr - col).min(S::LANES);
                // SAFETY: only the `cnt` columns below nr are touched.
                unsafe {
                    let out = if accumulate {
                        s.add(*r, s.load_part_ptr(cr.add(col), cnt, 0.0))
                    } else {
                        *r
                    };
                    s.store_part_ptr(cr.add(col), cnt, out);
                }
            }
        }
    }
}

/// Loads `cnt` (at most `LANES`) floats at `p`, zero-filling the rest.
///
/// # Safety
/// `p..p + cnt` must be readable.
#[inline(always)]
unsafe fn load_upto<S: Simd>(s: S, p: *const f32, cnt: usize) -> S::V {
    // SAFETY: forwarded caller contract.
    unsafe {
        if cnt == S::LANES {
            s.load_ptr(p)
        } else {
            s.load_part_ptr(p, cnt, 0.0)
        }
    }
}

/// Dot products of `MI` rows of `a` with `NJ` rows of `b`, each `k` long: `out[i][j]`.
///
/// # Safety
/// Every `a[i][..k]` and `b[j][..k]` must be readable.
#[inline(always)]
unsafe fn dot_block<S: Simd, const MI: usize, const NJ: usize>(
    s: S,
    k: usize,
    a: [*const f32; MI],
    b: [*const f32; NJ],
) -> [[f32; NJ]; MI] {
    let mut acc = [[s.zero(); NJ]; MI];
    let mut p = 0;
    while p < k {
        let cnt = (k - p).min(S::LANES);
        let mut bv = [s.zero(); NJ];
        for (v, &bp) in bv.iter_mut().zip(&b) {
            // SAFETY: p + cnt <= k, so the elements read are inside row j of B.
            *v = unsafe { load_upto(s, bp.add(p), cnt) };
        }
        for (row, &ap) in acc.iter_mut().zip(&a) {
            // SAFETY: as above, for row i of A.
            let av = unsafe { load_upto(s, ap.add(p), cnt) };
            for (r, bb) in row.iter_mut().zip(&bv) {
                *r = s.mul_add(av, *bb, *r);
            }
        }
        p += S::LANES;
    }
    let mut out = [[0.0; NJ]; MI];
    for (o, r) in out.iter_mut().zip(&acc) {
        for (x, v) in o.iter_mut().zip(r) {
            *x = s.reduce_add(*v);
        }
    }
    out
}

/// `C[m×n] (+)= A[m×k] · B[n×k]ᵀ` with no packing: every output is a vector dot product of
/// two contiguous rows. Best when `m` (or `n`) is tiny and packing would cost more than the
/// product; reads each row of `B` once per pair of `A` rows.
///
/// # Safety
/// `a[i*lda .. i*lda + k]`, `b[j*ldb .. j*ldb + k]` readable and `c[i*ldc .. i*ldc + n]`
/// readable and writable, for all `i < m`, `j < n`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_gemm_bt<S: Simd>(
    s: S,
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) {
    let arow = |i: usize| a.wrapping_add(i * lda);
    let brow = |j: usize| b.wrapping_add(j * ldb);
    // SAFETY: only called with i < m and j < n, whose C element the caller contract makes
    // readable and writable.
    let put = |i: usize, j: usize, v: f32| unsafe {
        let cp = c.add(i * ldc + j);
        *cp = if accumulate { *cp + v } else { v };
    };
    let mut j = 0;
    while j + 4 <= n {
        let bs = [brow(j), brow(j + 1), brow(j + 2), brow(j + 3)];
        let mut i = 0;
        while i + 2 <= m {
            // SAFETY: rows i, i+1 < m and j..j+4 <= n.
            let r = unsafe { dot_block::<S, 2, 4>(s, k, [arow(i), arow(i + 1)], bs) };
            for (di, row) in r.iter().enumerate() {
                for (dj, &v) in row.iter().enumerate() {
                    put(i + di, j + dj, v);
                }
            }
            i += 2;
        }
        if i < m {
            // SAFETY: row i < m and j..j+4 <= n.
            let r = unsafe { dot_block::<S, 1, 4>(s, k, [arow(i)], bs) };
            for (dj, &v) in r[0].iter().enumerate() {
                put(i, j + dj, v);
            }
        }
        j += 4;
    }
    for j in j..n {
        for i in 0..m {
            // SAFETY: row i < m and row j < n.
            let r = unsafe { dot_block::<S, 1, 1>(s, k, [arow(i)], [brow(j)]) };
            put(i, j, r[0][0]);
        }
    }
}
