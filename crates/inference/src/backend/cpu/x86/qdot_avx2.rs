//! AVX2 + FMA + F16C: the 8-row [`QSimd`] token of the quantized tiles and its table (for
//! CPUs without AVX-512 VNNI). A group of 16 rows is processed as two halves of 8.
//!
//! The byte dot product is `vpmaddubsw` (u8 × i8 → i16 pairs, saturating) then `vpmaddwd`
//! with ones. Codes below 64 cannot saturate (2 · 63 · 127 < 2¹⁵); the full-range Q8_0 codes
//! are split into `c >> 1` and `c & 1`, each exact, recombined in i32.

use core::arch::x86_64::*;

use super::super::detect::Isa;
use super::super::qdot::{quant_table, QSimd};

/// Proof that AVX2, FMA and F16C are available; zero-sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2Q {
    _proof: (),
}

impl Avx2Q {
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx2Q { _proof: () }
    }
}

// SAFETY (every `unsafe` block in this impl): holding an `Avx2Q` token proves the CPU has the
// features (see `new_unchecked`); pointer methods forward their callers' bounds contract.
impl QSimd for Avx2Q {
    const ROWS: usize = 8;
    type I = __m256i;
    type F = __m256;

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m256i {
        // SAFETY: token; 32 readable bytes (caller).
        unsafe { _mm256_loadu_si256(p as *const _) }
    }
    #[inline(always)]
    fn zero(self) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    fn splat(self, x: i32) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_set1_epi32(x) }
    }
    #[inline(always)]
    fn and(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    fn srl16<const N: u32>(self, a: __m256i) -> __m256i {
        // SAFETY: token. (The immediate is an i32 here; `N` is a constant, the match folds.)
        unsafe {
            match N {
                1 => _mm256_srli_epi16::<1>(a),
                2 => _mm256_srli_epi16::<2>(a),
                3 => _mm256_srli_epi16::<3>(a),
                4 => _mm256_srli_epi16::<4>(a),
                _ => _mm256_srl_epi16(a, _mm_cvtsi32_si128(N as i32)),
            }
        }
    }
    #[inline(always)]
    fn sll16<const N: u32>(self, a: __m256i) -> __m256i {
        // SAFETY: token. (As `srl16`.)
        unsafe {
            match N {
                1 => _mm256_slli_epi16::<1>(a),
                2 => _mm256_slli_epi16::<2>(a),
                3 => _mm256_slli_epi16::<3>(a),
                4 => _mm256_slli_epi16::<4>(a),
                _ => _mm256_sll_epi16(a, _mm_cvtsi32_si128(N as i32)),
            }
        }
    }
    #[inline(always)]
    fn add(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    fn mullo(self, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn dot(self, acc: __m256i, c: __m256i, y: i32) -> __m256i {
        // SAFETY: token. Codes < 64: the i16 pair sums cannot saturate.
        unsafe {
            let p = _mm256_maddubs_epi16(c, _mm256_set1_epi32(y));
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    fn dot_u8(self, acc: __m256i, c: __m256i, y: i32) -> __m256i {
        // SAFETY: token. c = 2·(c >> 1) + (c & 1), each part below 128: no saturation.
        unsafe {
            let yv = _mm256_set1_epi32(y);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<1>(c), _mm256_set1_epi8(0x7F));
            let lo = _mm256_and_si256(c, _mm256_set1_epi8(1));
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yv), _mm256_set1_epi16(2));
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, yv), _mm256_set1_epi16(1));
            _mm256_add_epi32(acc, _mm256_add_epi32(ph, pl))
        }
    }
    #[inline(always)]
    fn dot_i16(self, acc: __m256i, p: __m256i, y: i32) -> __m256i {
        // SAFETY: token.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi32(y))) }
    }
    #[inline(always)]
    unsafe fn load_u8x2_i16(self, p: *const u8) -> __m256i {
        // SAFETY: token; 16 readable bytes (caller).
        unsafe { _mm256_cvtepu8_epi16(_mm_loadu_si128(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_u8_i32(self, p: *const u8) -> __m256i {
        // SAFETY: token; 8 readable bytes (caller).
        unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_i8_i32(self, p: *const u8) -> __m256i {
        // SAFETY: token; 8 readable bytes (caller).
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u8) -> __m256 {
        // SAFETY: token; 16 readable bytes (caller).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const _)) }
    }
    #[inline(always)]
    fn zero_f(self) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat_f(self, x: f32) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    fn cvt(self, a: __m256i) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn mul_f(self, a: __m256, b: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn fma_f(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: token.
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store_f(self, p: *mut f32, v: __m256) {
        // SAFETY: token; 8 writable floats (caller).
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

quant_table!(
    isa: Isa::Avx2,
    token: Avx2Q,
    attr: [#[target_feature(enable = "avx2,fma,f16c")]],
);
