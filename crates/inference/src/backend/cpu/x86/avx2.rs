//! AVX2 with FMA: the 8-lane token and its kernel table.
//!
//! GEMM tile: 6 rows × 16 columns (12 ymm accumulators, 2 for the B row, 1 broadcast) out of
//! the 16 ymm registers. Edges use `vmaskmovps`, which never touches masked-off lanes.

use core::arch::x86_64::*;

use super::super::detect::Isa;
use super::super::simd::Simd;
use super::kernel_table;

/// Proof that AVX2 and FMA are available; zero-sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _proof: (),
}

impl Avx2 {
    /// # Safety
    /// The CPU must support AVX2 and FMA (`Isa::Avx2.is_supported()`).
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx2 { _proof: () }
    }
}

// SAFETY (every `unsafe` block in this impl): holding an `Avx2` token proves the CPU has AVX2
// and FMA (see `new_unchecked`); pointer methods forward their callers' bounds contract, and
// `vmaskmovps` never touches the lanes outside its mask.
impl Avx2 {
    /// Integer mask with the first `n` (at most 8) lanes set.
    #[inline(always)]
    fn lanes(self, n: usize) -> __m256i {
        // SAFETY: token.
        unsafe {
            let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            _mm256_cmpgt_epi32(_mm256_set1_epi32(n.min(8) as i32), iota)
        }
    }
}

impl Simd for Avx2 {
    const LANES: usize = 8;
    type V = __m256;
    type M = __m256;

    #[inline(always)]
    fn splat(self, x: f32) -> __m256 {
        // SAFETY: token (see above).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load_ptr(self, p: *const f32) -> __m256 {
        // SAFETY: token; 8 readable floats at p (caller).
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    fn prefetch<T>(self, p: *const T) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
    }
    #[inline(always)]
    unsafe fn load_i32_ptr(self, p: *const i32) -> __m256 {
        // SAFETY: token; 8 readable i32 at p (caller).
        unsafe { _mm256_cvtepi32_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    #[inline(always)]
    unsafe fn load_bf16_ptr(self, p: *const u16) -> __m256 {
        // SAFETY: token; 8 readable bf16 values at p (caller). Widening is a 16-bit shift.
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }
    #[inline(always)]
    unsafe fn store_ptr(self, p: *mut f32, v: __m256) {
        // SAFETY: token; 8 writable floats at p (caller).
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn load_part_ptr(self, p: *const f32, n: usize, fill: f32) -> __m256 {
        // SAFETY: token; only the first n lanes are read (caller guarantees them).
        unsafe {
            let m = self.lanes(n);
            let v = _mm256_maskload_ps(p, m);
            _mm256_blendv_ps(_mm256_set1_ps(fill), v, _mm256_castsi256_ps(m))
        }
    }
    #[inline(always)]
    unsafe fn store_part_ptr(self, p: *mut f32, n: usize, v: __m256) {
        // SAFETY: token; only the first n lanes are written (caller guarantees them).
        unsafe { _mm256_maskstore_ps(p, self.lanes(n), v) }
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn recip_approx(self, a: __m256) -> __m256 {
        // SAFETY: token. vrcpps is good to 1.5·2^-12; one Newton step, r·(2 − a·r), squares
        // that error.
        unsafe {
            let r = _mm256_rcp_ps(a);
            _mm256_mul_ps(r, _mm256_fnmadd_ps(a, r, _mm256_set1_ps(2.0)))
        }
    }
    #[inline(always)]
    fn mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn neg_mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    fn abs(self, a: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    fn copysign(self, mag: __m256, sign: __m256) -> __m256 {
        // SAFETY: token.
        unsafe {
            let m = _mm256_set1_ps(-0.0);
            _mm256_or_ps(_mm256_andnot_ps(m, mag), _mm256_and_ps(m, sign))
        }
    }
    #[inline(always)]
    fn round(self, a: __m256) -> __m256 {
        // SAFETY: token. Immediate 0x08: round to nearest even, suppress exceptions.
        unsafe { _mm256_round_ps::<0x08>(a) }
    }
    #[inline(always)]
    fn ldexp(self, a: __m256, n: __m256) -> __m256 {
        // a · 2^n1 · 2^n2 with n = n1 + n2 and both halves normal exponents, so that results
        // in the subnormal range are rounded once, by the second product.
        // SAFETY: token.
        unsafe {
            let n = _mm256_cvtps_epi32(n);
            let n = _mm256_min_epi32(
                _mm256_max_epi32(n, _mm256_set1_epi32(-252)),
                _mm256_set1_epi32(254),
            );
            let n1 = _mm256_srai_epi32::<1>(n);
            let n2 = _mm256_sub_epi32(n, n1);
            let bias = _mm256_set1_epi32(127);
            let p1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
            let p2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
            _mm256_mul_ps(_mm256_mul_ps(a, p1), p2)
        }
    }
    #[inline(always)]
    fn lt(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(a, b) }
    }
    #[inline(always)]
    fn select(self, m: __m256, t: __m256, f: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_blendv_ps(f, t, m) }
    }
    #[inline(always)]
    fn transpose(self, rows: &mut [__m256]) {
        let r: &mut [__m256; 8] = rows.try_into().expect("transpose takes 8 rows");
        // SAFETY: token. Interleave row pairs within 128-bit halves, gather 4-row columns
        // within halves, then swap halves.
        unsafe {
            let mut t = [_mm256_setzero_ps(); 8];
            for i in 0..4 {
                t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
                t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for g in 0..2 {
                let (a0, a1, b0, b1) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
                u[4 * g] = _mm256_shuffle_ps::<0x44>(a0, b0);
                u[4 * g + 1] = _mm256_shuffle_ps::<0xEE>(a0, b0);
                u[4 * g + 2] = _mm256_shuffle_ps::<0x44>(a1, b1);
                u[4 * g + 3] = _mm256_shuffle_ps::<0xEE>(a1, b1);
            }
            for c in 0..4 {
                r[c] = _mm256_permute2f128_ps::<0x20>(u[c], u[4 + c]);
                r[4 + c] = _mm256_permute2f128_ps::<0x31>(u[c], u[4 + c]);
            }
        }
    }
    #[inline(always)]
    fn reduce_add(self, v: __m256) -> f32 {
        // SAFETY: token.
        unsafe {
            let h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps::<0b01>(h, h));
            _mm_cvtss_f32(h)
        }
    }
    #[inline(always)]
    fn reduce_max(self, v: __m256) -> f32 {
        // SAFETY: token.
        unsafe {
            let h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_shuffle_ps::<0b01>(h, h));
            _mm_cvtss_f32(h)
        }
    }
}

kernel_table! {
    isa: Isa::Avx2,
    token: Avx2,
    features: "avx2,fma",
    tile: (6, 2),
    rows: [1 2 3 4 5 6],
    blocks: (kc: 256, mc: 96, nc: 512),
    // Measured on Zen 3 (2026-12-04, `benches/kernels.rs`): the encoder shapes' products at
    // 512 rows 174-181 GFLOP/s with A in place against 158-162 packed.
    a_in_place: true,
}
