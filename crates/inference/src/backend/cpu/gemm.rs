//! The SGEMM driver shared by every instruction set: argument checks, the choice between the
//! unpacked dot-product path and the blocked path, the split over threads, cache blocking,
//! packing, and the fused bias/GELU epilogue.
//!
//! Blocked path (the classic Goto/BLIS structure): for each `nc`-column block of C and each
//! `kc`-deep slice of the product, B's block is packed into `NR`-wide panels (for `A·B` the
//! full panels are read in place, since their rows are already contiguous; weights packed at
//! load time by `packed.rs` are used as they are); then for each `mc`-row block of A, A is
//! packed into `MR`-high slivers (or, where the instruction set says `a_in_place`, its rows
//! are read where they lie), and for each sliver (kept in L1) the microkernel sweeps the
//! `MR×NR` tiles across the B block (kept in L2). The instruction set provides the
//! microkernel, its tile, the packing kernel and the block sizes (`GemmSpec`); this file
//! holds no intrinsics.

use super::dispatch::{GemmSpec, Kernels};
use super::pack::{pack_cols, with_bufs};
use super::threads;

/// How `B` is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BLayout {
    /// `B` is `[n×k]` (rows `ldb` apart) and the product is `A·Bᵀ` (`nn.Linear` weights).
    Trans,
    /// `B` is `[k×n]` (rows `ldb` apart) and the product is `A·B`.
    NoTrans,
    /// `B` is a weight matrix already packed by `packed::pack` (`ldb` = its padded width) and
    /// the product is `A·Bᵀ`.
    Packed,
    /// [`BLayout::Packed`] with bf16 values (bits, in the problem's `b16`), widened to f32 as
    /// the microkernel loads them: the same products and sums as `Packed` over the widened
    /// matrix, so the results are bit-identical.
    PackedBf16,
}

/// What happens to each output element after the product: `c = act(c + bias[j])`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Epilogue<'a> {
    /// f32 `[n]`, added to every row of C.
    pub bias: Option<&'a [f32]>,
    /// Apply exact GELU after the bias.
    pub gelu: bool,
}

impl Epilogue<'_> {
    fn is_noop(&self) -> bool {
        self.bias.is_none() && !self.gelu
    }
}

/// With `A·Bᵀ`, products where `m` or `n` is at most this use unpacked dot products.
const DOT_MAX: usize = 4;
/// With `A·Bᵀ`, products with at most this many rows and a depth of at least [`DOT_MIN_K`]
/// also use dot products: transposing B for the blocked path would cost more than the
/// reductions (measured on Zen 4: 86 against 45 GFLOP/s at m = 8, 100 against 80 at m = 32).
const DOT_MAX_M: usize = 32;
/// See [`DOT_MAX_M`]: below this depth the horizontal reductions dominate.
const DOT_MIN_K: usize = 128;

/// Whether an `A·Bᵀ` block of `m×n×k` goes through the unpacked dot-product kernel.
fn use_dot(layout: BLayout, m: usize, n: usize, k: usize) -> bool {
    layout == BLayout::Trans && (m.min(n) <= DOT_MAX || (m <= DOT_MAX_M && k >= DOT_MIN_K))
}

/// Base pointer and row stride of C. Copies are handed to worker threads, each of which
/// writes only its own disjoint block of rows and columns.
#[derive(Clone, Copy)]
struct CMat {
    ptr: *mut f32,
    ld: usize,
}

// SAFETY: `CMat` is a plain address; `gemm` gives every thread a disjoint block of C and keeps
// the `&mut [f32]` it came from borrowed until all threads are done.
unsafe impl Send for CMat {}
// SAFETY: as above, no two threads write the same element.
unsafe impl Sync for CMat {}

impl CMat {
    fn at(self, i: usize, j: usize) -> *mut f32 {
        self.ptr.wrapping_add(i * self.ld + j)
    }
}

/// Everything one block of the product needs, shared by the threads.
struct Problem<'a> {
    kt: &'a Kernels,
    layout: BLayout,
    k: usize,
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    /// B's values for [`BLayout::PackedBf16`] (empty otherwise).
    b16: &'a [u16],
    ldb: usize,
    c: CMat,
    accumulate: bool,
    epi: Epilogue<'a>,
}

/// `C[m×n] = epi((accumulate ? C : 0) + A[m×k] · op(B))`. Panics if a slice is too short for
/// its shape and leading dimension, if `ldc < n` (rows would overlap), or if the bias is
/// shorter than `n`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    kt: &Kernels,
    layout: BLayout,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: Epilogue<'_>,
) {
    assert!(
        layout != BLayout::PackedBf16,
        "gemm: bf16 panels go through gemm_packed_bf16"
    );
    gemm_any(
        kt,
        layout,
        m,
        n,
        k,
        a,
        lda,
        (b, &[]),
        ldb,
        c,
        ldc,
        accumulate,
        epi,
    );
}

/// [`gemm`] with B a bf16 weight matrix packed like [`BLayout::Packed`] (`b16`, `ldb` its padded
/// width): bit-identical to `Packed` over the widened values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_packed_bf16(
    kt: &Kernels,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    b16: &[u16],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: Epilogue<'_>,
) {
    let layout = BLayout::PackedBf16;
    gemm_any(
        kt,
        layout,
        m,
        n,
        k,
        a,
        lda,
        (&[], b16),
        ldb,
        c,
        ldc,
        accumulate,
        epi,
    );
}

/// [`gemm`] over either kind of B values (`(f32, bf16)`, one of them empty).
#[allow(clippy::too_many_arguments)]
fn gemm_any(
    kt: &Kernels,
    layout: BLayout,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    (b, b16): (&[f32], &[u16]),
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    epi: Epilogue<'_>,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(m == 1 || ldc >= n, "gemm: ldc {ldc} < n {n}");
    assert!(c.len() >= (m - 1) * ldc + n, "gemm: C too short");
    if let Some(bias) = epi.bias {
        assert!(bias.len() >= n, "gemm: bias shorter than n");
    }
    if k > 0 {
        assert!(a.len() >= (m - 1) * lda + k, "gemm: A too short");
        let b_need = match layout {
            BLayout::Trans => (n - 1) * ldb + k,
            BLayout::NoTrans => (k - 1) * ldb + n,
            BLayout::Packed | BLayout::PackedBf16 => {
                let nr = kt.gemm.nr;
                assert!(ldb >= n && ldb.is_multiple_of(nr), "gemm: bad packed width");
                ldb * k
            }
        };
        let b_len = if layout == BLayout::PackedBf16 {
            b16.len()
        } else {
            b.len()
        };
        assert!(b_len >= b_need, "gemm: B too short");
    }
    let p = Problem {
        kt,
        layout,
        k,
        a,
        lda,
        b,
        b16,
        ldb,
        c: CMat {
            ptr: c.as_mut_ptr(),
            ld: ldc,
        },
        accumulate,
        epi,
    };
    let flops = 2 * m * n * k;
    let threads = if flops >= threads::PAR_MIN_FLOPS {
        threads::count()
    } else {
        1
    };
    let spec = &kt.gemm;
    // Split the larger dimension: the other operand's packing is what each part repeats, so
    // parts are kept large enough to amortize it. Packed weights are not repacked, so rows
    // are split whenever there are enough of them.
    let split_cols = match layout {
        BLayout::Packed | BLayout::PackedBf16 => m < 4 * spec.mr * threads,
        _ => n >= m,
    };
    if split_cols {
        let min_cols = (2 * spec.nr).max(256);
        threads::for_each_range(n, spec.nr, min_cols, threads, |j0, j1| {
            block(&p, 0, m, j0, j1 - j0);
        });
    } else {
        let min_rows = (2 * spec.mr).max(128);
        threads::for_each_range(m, spec.mr, min_rows, threads, |i0, i1| {
            block(&p, i0, i1 - i0, 0, n);
        });
    }
}

/// Computes the block `C[i0..i0+m, j0..j0+n]` on the calling thread.
fn block(p: &Problem<'_>, i0: usize, m: usize, j0: usize, n: usize) {
    if p.k == 0 {
        for i in 0..m {
            let row = c_row(p.c, i0 + i, j0, n);
            if !p.accumulate {
                row.fill(0.0);
            }
            epilogue(p, row, j0);
        }
        return;
    }
    if use_dot(p.layout, m, n, p.k) {
        // SAFETY: the table holding `dot` was handed out only after its instruction set was
        // detected; `gemm` checked that rows i0..i0+m of A, rows j0..j0+n of B (k long) and
        // this block of C are in bounds, and this thread owns the block of C.
        unsafe {
            (p.kt.gemm.dot)(
                m,
                n,
                p.k,
                p.a.as_ptr().wrapping_add(i0 * p.lda),
                p.lda,
                p.b.as_ptr().wrapping_add(j0 * p.ldb),
                p.ldb,
                p.c.at(i0, j0),
                p.c.ld,
                p.accumulate,
            );
        }
        if !p.epi.is_noop() {
            for i in 0..m {
                epilogue(p, c_row(p.c, i0 + i, j0, n), j0);
            }
        }
        return;
    }
    blocked(p, i0, m, j0, n);
}

/// Row `i`, columns `j..j+n` of C as a slice.
fn c_row<'c>(c: CMat, i: usize, j: usize, n: usize) -> &'c mut [f32] {
    // SAFETY: `gemm` checked that every row of C below m holds n columns, callers stay inside
    // the block their thread owns, and no other reference to these elements is alive.
    unsafe { std::slice::from_raw_parts_mut(c.at(i, j), n) }
}

/// Applies the epilogue to `row`, whose first element is column `j` of C.
fn epilogue(p: &Problem<'_>, row: &mut [f32], j: usize) {
    if let Some(bias) = p.epi.bias {
        // SAFETY: the table's kernels run only on a CPU that passed detection.
        unsafe { (p.kt.add_bias)(row, &bias[j..j + row.len()]) };
    }
    if p.epi.gelu {
        // SAFETY: as above.
        unsafe { (p.kt.gelu_erf)(row) };
    }
}

/// Sizes of the packing buffers the blocked path needs for an `m×n×k` block.
fn buf_lens(spec: &GemmSpec, layout: BLayout, m: usize, n: usize, k: usize) -> (usize, usize) {
    let kc = spec.kc.min(k);
    let a_len = if spec.a_in_place {
        0
    } else {
        spec.mc.min(m.next_multiple_of(spec.mr)) * kc
    };
    let b_cols = match layout {
        BLayout::Trans => spec.nc.min(n.next_multiple_of(spec.nr)),
        BLayout::NoTrans => spec.nr,
        BLayout::Packed | BLayout::PackedBf16 => 0,
    };
    (a_len, b_cols * kc)
}

/// The packed, cache-blocked product for the block `C[i0.., j0..]` of `m×n`.
fn blocked(p: &Problem<'_>, i0: usize, m: usize, j0: usize, n: usize) {
    let spec = &p.kt.gemm;
    let (mr, nr) = (spec.mr, spec.nr);
    let (a_len, b_len) = buf_lens(spec, p.layout, m, n, p.k);
    with_bufs(a_len, b_len, |abuf, bbuf| {
        for jc in (0..n).step_by(spec.nc) {
            let nc = spec.nc.min(n - jc);
            for pc in (0..p.k).step_by(spec.kc) {
                let kc = spec.kc.min(p.k - pc);
                let acc = p.accumulate || pc > 0;
                let last = pc + kc == p.k;
                let col0 = j0 + jc;
                match p.layout {
                    // SAFETY: the packing kernel comes from a table handed out after detection.
                    BLayout::Trans => unsafe {
                        (spec.pack_rows)(bbuf, p.b, p.ldb, col0, nc, pc, kc, nr)
                    },
                    BLayout::NoTrans if !nc.is_multiple_of(nr) => {
                        let edge = nc - nc % nr;
                        pack_cols(bbuf, p.b, p.ldb, col0 + edge, nc - edge, pc, kc, nr);
                    }
                    BLayout::NoTrans | BLayout::Packed | BLayout::PackedBf16 => {}
                }
                // (pointer, row stride) of the B panel starting at block column jr.
                let panel = |jr: usize| match p.layout {
                    BLayout::Trans => (bbuf.as_ptr().wrapping_add(jr * kc), nr),
                    BLayout::NoTrans if jr + nr > nc => (bbuf.as_ptr(), nr),
                    BLayout::NoTrans => (p.b.as_ptr().wrapping_add(pc * p.ldb + col0 + jr), p.ldb),
                    BLayout::Packed => {
                        (p.b.as_ptr().wrapping_add(pc * p.ldb + (col0 + jr) * kc), nr)
                    }
                    // Read through `b16` below.
                    BLayout::PackedBf16 => (std::ptr::null(), nr),
                };
                for ic in (0..m).step_by(spec.mc) {
                    let mc = spec.mc.min(m - ic);
                    // A's rows for the microkernel, `(pointer, astep, arow)`: read where they
                    // lie (`astep` 1, `arow` lda), or packed into slivers of MR rows (`astep`
                    // MR, `arow` 1; fewer rows than MR are packed `mc` wide, no zero rows to
                    // stream through L1).
                    let direct = mc == 1 || spec.a_in_place;
                    let astep = if direct { 1 } else { mr.min(mc) };
                    let arow = if direct { p.lda } else { 1 };
                    if !direct {
                        // SAFETY: as above.
                        unsafe { (spec.pack_rows)(abuf, p.a, p.lda, i0 + ic, mc, pc, kc, astep) };
                    }
                    let a_at = |ir: usize| {
                        if direct {
                            p.a.as_ptr().wrapping_add((i0 + ic + ir) * p.lda + pc)
                        } else {
                            abuf.as_ptr().wrapping_add(ir * kc)
                        }
                    };
                    // One A sliver stays in L1 while the B panels stream from L2.
                    for ir in (0..mc).step_by(mr) {
                        let mrr = mr.min(mc - ir);
                        for jr in (0..nc).step_by(nr) {
                            let nrr = nr.min(nc - jr);
                            let (bp, ldbp) = panel(jr);
                            let (ci, cj) = (i0 + ic + ir, col0 + jr);
                            // SAFETY: the microkernel comes from a table handed out only after
                            // detection. A's mrr rows (`a_at`: kc steps of `astep` floats,
                            // rows `arow` apart: the packed sliver, or rows i0 + ic + ir.. of A
                            // in place, inside A as checked by `gemm`) and the B panel
                            // (kc rows of NR floats, ldbp apart: packed here, packed at load
                            // time, or in place inside B, all as checked by `gemm`) are
                            // readable; the mrr×nrr tile of C is in bounds and owned by this
                            // thread.
                            if p.layout == BLayout::PackedBf16 {
                                // SAFETY: as for `ukr` below, the panel being the bf16 values
                                // at the same offsets (checked by `gemm_any`).
                                unsafe {
                                    (spec.ukr_bf16)(
                                        kc,
                                        a_at(ir),
                                        astep,
                                        arow,
                                        p.b16.as_ptr().wrapping_add(pc * p.ldb + (col0 + jr) * kc),
                                        ldbp,
                                        p.c.at(ci, cj),
                                        p.c.ld,
                                        mrr,
                                        nrr,
                                        acc,
                                    );
                                }
                            } else {
                                // SAFETY: see above.
                                unsafe {
                                    (spec.ukr)(
                                        kc,
                                        a_at(ir),
                                        astep,
                                        arow,
                                        bp,
                                        ldbp,
                                        p.c.at(ci, cj),
                                        p.c.ld,
                                        mrr,
                                        nrr,
                                        acc,
                                    );
                                }
                            }
                        }
                        // The epilogue over the sliver's whole rows (one call per row, not
                        // per tile: GELU's set-up and latency chain then spread over `nc`
                        // values), while they are in cache.
                        if last && !p.epi.is_noop() {
                            for i in 0..mrr {
                                epilogue(p, c_row(p.c, i0 + ic + ir + i, col0, nc), col0);
                            }
                        }
                    }
                }
            }
        }
    });
}
