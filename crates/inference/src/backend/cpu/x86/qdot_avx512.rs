//! AVX-512 with VNNI and BW: the 16-row [`QSimd`] token of the quantized tiles and its table.
//!
//! One zmm holds 4 codes of each of 16 weight rows; `vpdpbusd` multiplies them by 4 broadcast
//! activation codes and adds the 4 products into each row's i32 lane. Shifts of 16-bit lanes
//! and the byte widening loads need AVX512BW, `vpdpwssd` (Q4_K mins) VNNI.

use core::arch::x86_64::*;

use super::super::detect::Isa;
use super::super::qdot::{quant_table, QSimd};

/// Proof that AVX-512 F/BW/VL/VNNI, AVX2 and FMA are available; zero-sized.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx512Vnni {
    _proof: (),
}

impl Avx512Vnni {
    /// # Safety
    /// The CPU must support AVX-512 F, BW, VL and VNNI, AVX2 and FMA.
    #[inline(always)]
    pub(crate) unsafe fn new_unchecked() -> Self {
        Avx512Vnni { _proof: () }
    }
}

// SAFETY (every `unsafe` block in this impl): holding an `Avx512Vnni` token proves the CPU has
// the features (see `new_unchecked`); pointer methods forward their callers' bounds contract.
impl QSimd for Avx512Vnni {
    const ROWS: usize = 16;
    type I = __m512i;
    type F = __m512;

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> __m512i {
        // SAFETY: token; 64 readable bytes (caller).
        unsafe { _mm512_loadu_si512(p as *const _) }
    }
    #[inline(always)]
    fn zero(self) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    fn splat(self, x: i32) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_set1_epi32(x) }
    }
    #[inline(always)]
    fn and(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    fn or(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    fn srl16<const N: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_srli_epi16::<N>(a) }
    }
    #[inline(always)]
    fn sll16<const N: u32>(self, a: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_slli_epi16::<N>(a) }
    }
    #[inline(always)]
    fn add(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    fn mullo(self, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    fn dot(self, acc: __m512i, c: __m512i, y: i32) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_dpbusd_epi32(acc, c, _mm512_set1_epi32(y)) }
    }
    #[inline(always)]
    fn dot_u8(self, acc: __m512i, c: __m512i, y: i32) -> __m512i {
        // SAFETY: token. `vpdpbusd` does not saturate: any unsigned code is exact.
        unsafe { _mm512_dpbusd_epi32(acc, c, _mm512_set1_epi32(y)) }
    }
    #[inline(always)]
    fn dot_i16(self, acc: __m512i, p: __m512i, y: i32) -> __m512i {
        // SAFETY: token.
        unsafe { _mm512_dpwssd_epi32(acc, p, _mm512_set1_epi32(y)) }
    }
    #[inline(always)]
    unsafe fn load_u8x2_i16(self, p: *const u8) -> __m512i {
        // SAFETY: token; 32 readable bytes (caller).
        unsafe { _mm512_cvtepu8_epi16(_mm256_loadu_si256(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_u8_i32(self, p: *const u8) -> __m512i {
        // SAFETY: token; 16 readable bytes (caller).
        unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_i8_i32(self, p: *const u8) -> __m512i {
        // SAFETY: token; 16 readable bytes (caller).
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p as *const _)) }
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u8) -> __m512 {
        // SAFETY: token; 32 readable bytes (caller).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const _)) }
    }
    #[inline(always)]
    fn zero_f(self) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat_f(self, x: f32) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    fn cvt(self, a: __m512i) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    fn mul_f(self, a: __m512, b: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn fma_f(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: token.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn store_f(self, p: *mut f32, v: __m512) {
        // SAFETY: token; 16 writable floats (caller).
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

quant_table!(
    isa: Isa::Avx512,
    token: Avx512Vnni,
    attr: [#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]],
);
