//! AVX512_BF16: the `vdpbf16ps` microkernel and the `vcvtne2ps2bf16` activation conversion of
//! the bf16 GEMM (`bf16.rs` owns the layout, the driver and the arithmetic it must match).
//!
//! Tile: 12 rows × 32 columns, 24 zmm accumulators; per depth pair, two panel vectors are
//! loaded and each row's pair is broadcast from memory into 2 `vdpbf16ps` (64 flops each).
//! On Zen 4 `vdpbf16ps zmm` has the throughput of `vfmadd231ps zmm` (one per cycle: both
//! 0.274 ns per instruction over 12 independent chains on the 3.66 GHz dev VM) and a latency of
//! 6 cycles against the FMA's 4 (1.64 and 1.09 ns in one dependent chain), so one core peaks
//! at 64 flops per cycle, 233 GFLOP/s, twice the f32 peak; 24 accumulators hide the latency.

use core::arch::x86_64::*;

use super::super::bf16::{cvt_rows, Kernel, MR, NR};

/// The AVX512_BF16 kernel; `bf16::kernel` hands it out only after `bf16::native_supported`.
pub(in crate::backend::cpu) const KERNEL: Kernel = Kernel {
    ukr,
    cvt,
    mr: MR,
    whole_depth: false,
    name: "avx512bf16",
};

/// Mask of the first `n` (at most 16) lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

/// The microkernel (`bf16::Ukr`): dispatches on the tile's row count.
///
/// # Safety
/// The `bf16::Ukr` contract; the CPU must support AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn ukr(
    kcp: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    _next_b: *const u32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    load_c: bool,
) {
    // SAFETY: forwarded contract; each arm reads and writes exactly `mr` rows.
    unsafe {
        match mr {
            1 => tile::<1>(kcp, a, lda, b, c, ldc, nr, load_c),
            2 => tile::<2>(kcp, a, lda, b, c, ldc, nr, load_c),
            3 => tile::<3>(kcp, a, lda, b, c, ldc, nr, load_c),
            4 => tile::<4>(kcp, a, lda, b, c, ldc, nr, load_c),
            5 => tile::<5>(kcp, a, lda, b, c, ldc, nr, load_c),
            6 => tile::<6>(kcp, a, lda, b, c, ldc, nr, load_c),
            7 => tile::<7>(kcp, a, lda, b, c, ldc, nr, load_c),
            8 => tile::<8>(kcp, a, lda, b, c, ldc, nr, load_c),
            9 => tile::<9>(kcp, a, lda, b, c, ldc, nr, load_c),
            10 => tile::<10>(kcp, a, lda, b, c, ldc, nr, load_c),
            11 => tile::<11>(kcp, a, lda, b, c, ldc, nr, load_c),
            12 => tile::<12>(kcp, a, lda, b, c, ldc, nr, load_c),
            _ => unreachable!("tile rows above MR"),
        }
    }
}

const _: () = assert!(MR == 12 && NR == 32);

/// One `M × 32` tile: `c = chain(load_c ? c : 0, a, b)` (see `bf16`'s module doc; the
/// instruction itself applies the flushes).
///
/// # Safety
/// The `bf16::Ukr` contract with `mr = M`; AVX-512F and AVX512_BF16.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const M: usize>(
    kcp: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    nr: usize,
    load_c: bool,
) {
    let (m0, m1) = (lanes(nr), lanes(nr.saturating_sub(16)));
    // SAFETY (whole body): the features are enabled by the caller's `target_feature`; C rows
    // i < M hold nr columns and masked loads and stores touch only those; the panel holds
    // kcp·32 pairs and A row i holds kcp pairs at a + i·lda (contract).
    unsafe {
        let mut acc0 = [_mm512_setzero_ps(); M];
        let mut acc1 = [_mm512_setzero_ps(); M];
        if load_c {
            for i in 0..M {
                acc0[i] = _mm512_maskz_loadu_ps(m0, c.add(i * ldc));
                acc1[i] = _mm512_maskz_loadu_ps(m1, c.add(i * ldc + 16));
            }
        }
        let mut rows = [a; M];
        for (i, r) in rows.iter_mut().enumerate() {
            *r = a.add(i * lda);
        }
        let mut bp = b;
        for p in 0..kcp {
            let b0: __m512bh = core::mem::transmute(_mm512_loadu_si512(bp as *const _));
            let b1: __m512bh = core::mem::transmute(_mm512_loadu_si512(bp.add(16) as *const _));
            for i in 0..M {
                let av: __m512bh = core::mem::transmute(_mm512_set1_epi32(*rows[i].add(p) as i32));
                acc0[i] = _mm512_dpbf16_ps(acc0[i], av, b0);
                acc1[i] = _mm512_dpbf16_ps(acc1[i], av, b1);
            }
            bp = bp.add(NR);
        }
        for i in 0..M {
            _mm512_mask_storeu_ps(c.add(i * ldc), m0, acc0[i]);
            _mm512_mask_storeu_ps(c.add(i * ldc + 16), m1, acc1[i]);
        }
    }
}

/// Activation conversion (`bf16::CvtRows`) with `vcvtne2ps2bf16`, 32 floats at a time
/// (bit-identical to `bf16::round_to_bf16`, which the tests check through the products).
///
/// # Safety
/// The CPU must support AVX-512F and AVX512_BF16.
#[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
unsafe fn cvt(
    src: &[f32],
    ld: usize,
    rows: usize,
    k: usize,
    kp0: usize,
    kcp: usize,
    dst: &mut [u32],
) {
    let q0 = 2 * kp0;
    let q1 = k.min(2 * (kp0 + kcp));
    if q1 <= q0 {
        return cvt_rows(src, ld, rows, k, kp0, kcp, dst);
    }
    for r in 0..rows {
        let row = &src[r * ld + q0..r * ld + q1];
        let out = &mut dst[r * kcp..(r + 1) * kcp];
        assert!(out.len() * 2 >= row.len());
        for (ci, chunk) in row.chunks(32).enumerate() {
            let len = chunk.len();
            let p = chunk.as_ptr();
            let o = out.as_mut_ptr().wrapping_add(16 * ci);
            // SAFETY: features enabled above; `chunk` holds `len` readable floats and the
            // masks cover only those; `out` holds kcp >= (16·ci + ceil(len/2)) pairs (asserted:
            // 2·kcp >= row length), and the store mask covers ceil(len/2) lanes.
            unsafe {
                let lo = _mm512_maskz_loadu_ps(lanes(len), p);
                let hi = _mm512_maskz_loadu_ps(lanes(len.saturating_sub(16)), p.wrapping_add(16));
                let v: __m512i = core::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_mask_storeu_epi32(o as *mut i32, lanes(len.div_ceil(2)), v);
            }
        }
    }
}
