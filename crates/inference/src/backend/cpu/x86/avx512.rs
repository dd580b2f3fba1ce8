//! AVX-512F: the 16-lane token and its kernel table.
//!
//! GEMM tile: 12 rows × 32 columns (24 zmm accumulators, 2 for the B row, broadcasts of A
//! folded into the FMAs as memory operands), out of the 32 zmm registers. Edges use masked
//! loads and stores, so partial tiles need no scratch copies.
//!
//! The AVX-512 intrinsics and `target_feature(enable = "avx512f")` are stable since Rust 1.89,
//! which is therefore the real minimum toolchain of this crate on x86-64 (see `x86/mod.rs`).

use core::arch::x86_64::*;

use super::super::detect::Isa;
use super::super::simd::Simd;
use super::kernel_table;

/// Proof that AVX-512F (with AVX2 and FMA) is available; zero-sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512 {
    _proof: (),
}

impl Avx512 {
    /// # Safety
    /// The CPU must support AVX-512F, AVX2 and FMA (`Isa::Avx512.is_supported()`).
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx512 { _proof: () }
    }
}

/// Mask of the first `n` (at most 16) lanes.
#[inline(always)]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n.min(16)) - 1) as __mmask16
}

// SAFETY (every `unsafe` block in this impl): holding an `Avx512` token proves the CPU has
// AVX-512F (see `new_unchecked`); pointer methods forward their callers' bounds contract, and
// masked loads and stores never touch the lanes outside their mask.
impl Simd for Avx512 {
    const LANES: usize = 16;
    type V = __m512;
    type M = __mmask16;

    #[inline(always)]
    fn splat(self, x: f32) -> __m512 {
        // SAFETY: token (see above).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load_ptr(self, p: *const f32) -> __m512 {
        // SAFETY: token; 16 readable floats at p (caller).
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    fn prefetch<T>(self, p: *const T) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
    #[inline(always)]
    unsafe fn load_i32_ptr(self, p: *const i32) -> __m512 {
        // SAFETY: token; 16 readable i32 at p (caller).
        unsafe { _mm512_cvtepi32_ps(_mm512_loadu_si512(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_bf16_ptr(self, p: *const u16) -> __m512 {
        // SAFETY: token; 16 readable bf16 values at p (caller). Widening is a 16-bit shift.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
    }
    #[inline(always)]
    unsafe fn store_ptr(self, p: *mut f32, v: __m512) {
        // SAFETY: token; 16 writable floats at p (caller).
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part_ptr(self, p: *const f32, n: usize, fill: f32) -> __m512 {
        // SAFETY: token; only the first n lanes are read (caller guarantees them).
        unsafe { _mm512_mask_loadu_ps(_mm512_set1_ps(fill), lanes(n), p) }
    }
    #[inline(always)]
    unsafe fn store_part_ptr(self, p: *mut f32, n: usize, v: __m512) {
        // SAFETY: token; only the first n lanes are written (caller guarantees them).
        unsafe { _mm512_mask_storeu_ps(p, lanes(n), v) }
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn recip_approx(self, a: __m512) -> __m512 {
        // SAFETY: token. (vrcp14ps: relative error below 2^-14.)
        unsafe { _mm512_rcp14_ps(a) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn neg_mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_abs_ps(a) }
    }
    #[inline(always)]
    fn copysign(self, mag: __m512, sign: __m512) -> __m512 {
        // SAFETY: token.
        unsafe {
            let m = _mm512_set1_epi32(i32::MIN);
            let s = _mm512_and_si512(_mm512_castps_si512(sign), m);
            let a = _mm512_andnot_si512(m, _mm512_castps_si512(mag));
            _mm512_castsi512_ps(_mm512_or_si512(a, s))
        }
    }
    #[inline(always)]
    fn round(self, a: __m512) -> __m512 {
        // SAFETY: token. Immediate 0x08: round to nearest even, suppress exceptions.
        unsafe { _mm512_roundscale_ps::<0x08>(a) }
    }
    #[inline(always)]
    fn ldexp(self, a: __m512, n: __m512) -> __m512 {
        // SAFETY: token. scalef handles subnormal results and overflow exactly.
        unsafe { _mm512_scalef_ps(a, n) }
    }
    #[inline(always)]
    fn lt(self, a: __m512, b: __m512) -> __mmask16 {
        // SAFETY: token.
        unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    fn select(self, m: __mmask16, t: __m512, f: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_mask_blend_ps(m, f, t) }
    }
    #[inline(always)]
    fn transpose(self, rows: &mut [__m512]) {
        let r: &mut [__m512; 16] = rows.try_into().expect("transpose takes 16 rows");
        // SAFETY: token. Three stages: interleave row pairs within 128-bit lanes, gather
        // 4-row columns within lanes, then a 4×4 transpose of the 128-bit lanes.
        unsafe {
            let mut t = [_mm512_setzero_ps(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let mut u = [_mm512_setzero_ps(); 16];
            for g in 0..4 {
                let (a0, a1, b0, b1) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
                u[4 * g] = _mm512_shuffle_ps::<0x44>(a0, b0);
                u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(a0, b0);
                u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(a1, b1);
                u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(a1, b1);
            }
            // u[4g + c] lane L holds column 4L + c of rows 4g..4g+4.
            for c in 0..4 {
                let x0 = _mm512_shuffle_f32x4::<0x88>(u[c], u[4 + c]);
                let x1 = _mm512_shuffle_f32x4::<0xDD>(u[c], u[4 + c]);
                let x2 = _mm512_shuffle_f32x4::<0x88>(u[8 + c], u[12 + c]);
                let x3 = _mm512_shuffle_f32x4::<0xDD>(u[8 + c], u[12 + c]);
                r[c] = _mm512_shuffle_f32x4::<0x88>(x0, x2);
                r[4 + c] = _mm512_shuffle_f32x4::<0x88>(x1, x3);
                r[8 + c] = _mm512_shuffle_f32x4::<0xDD>(x0, x2);
                r[12 + c] = _mm512_shuffle_f32x4::<0xDD>(x1, x3);
            }
        }
    }
    #[inline(always)]
    fn reduce_add(self, v: __m512) -> f32 {
        // SAFETY: token.
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m512) -> f32 {
        // SAFETY: token.
        unsafe { _mm512_reduce_max_ps(v) }
    }
}

kernel_table! {
    isa: Isa::Avx512,
    token: Avx512,
    features: "avx512f,avx2,fma",
    tile: (12, 2),
    rows: [1 2 3 4 5 6 7 8 9 10 11 12],
    blocks: (kc: 256, mc: 96, nc: 512),
    // Twelve rows read in place need more address registers than the tile leaves; packing
    // stays until an AVX-512 machine measures the other way.
    a_in_place: false,
}
