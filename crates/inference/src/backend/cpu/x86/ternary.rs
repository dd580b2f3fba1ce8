//! The [`TSimd`] tokens of the ternary tiles (`cpu::ternary`) for AVX-512 with BW, VL and VNNI
//! and for AVX2, and their tables.
//!
//! AVX-512: one zmm holds 16 two-bit codes of each of 16 weight rows (one i32 lane per row);
//! after a shift and a mask, `vpdpbusd` multiplies 4 codes (u8) of each row by 4 broadcast
//! activations (i8) and adds the products into the row's lane, exactly (no saturation).
//!
//! AVX2: 8 rows per ymm (each 16-row half of a group in two parts). `vpmaddubsw` gives i16
//! pairs, which are summed in i16 for up to 15 chunks (60 products of pairs: codes ≤ 2 and
//! |x| ≤ 128 bound a pair by 512, so a partial sum stays within ±30720, below the i16
//! saturation) and then widened with `vpmaddwd` by ones.
//!
//! Tile heights: 8 activation rows for AVX-512 (16 accumulators of the 32), 4 for AVX2.
//!
//! The int8 tile (`cpu::int8`, 8-bit codes `value + 128`): `vpdpbusd` on the codes, the tile
//! subtracting `128 · Σ x` at the end; on AVX2 the codes become signed values again and their
//! signs move onto the activations (`vpsignb`), so `vpmaddubsw` multiplies magnitudes ≤ 127
//! without saturating.

use core::arch::x86_64::*;

use super::super::ternary::TSimd;

/// AVX-512 F/BW/VL/VNNI: the 16-row token and its table; BitNet's row quantizer (F/BW).
pub(in crate::backend::cpu) mod avx512 {
    use super::*;
    use crate::backend::cpu::detect::Isa;
    use crate::backend::cpu::ternary::{round_clamp_finite, Quantizer, ROUND_MAGIC};

    /// Proof that AVX-512 F/BW/VL/VNNI are available; zero-sized.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx512Ternary {
        _proof: (),
    }

    impl Avx512Ternary {
        /// # Safety
        /// The CPU must support AVX-512 F, BW, VL and VNNI.
        #[inline(always)]
        pub(crate) unsafe fn new_unchecked() -> Self {
            Avx512Ternary { _proof: () }
        }
    }

    // SAFETY (every `unsafe` block in this impl): holding an `Avx512Ternary` token proves the
    // CPU has the features (see `new_unchecked`); pointer methods forward their callers'
    // bounds contract.
    impl TSimd for Avx512Ternary {
        const ROWS: usize = 16;
        // i32 partial sums: at most 4 · 2 · 128 per lane and dot, no limit in practice.
        const FLUSH: usize = usize::MAX;
        type I = __m512i;
        type A = __m512i;

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
        fn zero_a(self) -> __m512i {
            self.zero()
        }
        #[inline(always)]
        fn codes<const SH: u32>(self, v: __m512i) -> __m512i {
            // SAFETY: token. A 32-bit shift moves bits across bytes; the mask keeps only each
            // byte's own two bits.
            unsafe {
                let m = _mm512_set1_epi8(3);
                match SH {
                    0 => _mm512_and_si512(v, m),
                    1 => _mm512_and_si512(_mm512_srli_epi32::<2>(v), m),
                    2 => _mm512_and_si512(_mm512_srli_epi32::<4>(v), m),
                    _ => _mm512_and_si512(_mm512_srli_epi32::<6>(v), m),
                }
            }
        }
        #[inline(always)]
        fn dot(self, a: __m512i, c: __m512i, y: i32) -> __m512i {
            // SAFETY: token.
            unsafe { _mm512_dpbusd_epi32(a, c, _mm512_set1_epi32(y)) }
        }
        #[inline(always)]
        fn widen(self, acc: __m512i, a: __m512i) -> __m512i {
            // SAFETY: token.
            unsafe { _mm512_add_epi32(acc, a) }
        }
        #[inline(always)]
        fn sub_splat(self, acc: __m512i, s: i32) -> __m512i {
            // SAFETY: token.
            unsafe { _mm512_sub_epi32(acc, _mm512_set1_epi32(s)) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut i32, v: __m512i) {
            // SAFETY: token; 16 writable i32 (caller).
            unsafe { _mm512_storeu_si512(p as *mut _, v) }
        }
        #[inline(always)]
        fn prefetch(self, p: *const u8) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
        }
        const SIGNED8: bool = false;
        #[inline(always)]
        fn dot8(self, acc: __m512i, c: __m512i, y: i32) -> __m512i {
            // SAFETY: token. `vpdpbusd` adds the four u8 · i8 products into each lane without
            // saturating.
            unsafe { _mm512_dpbusd_epi32(acc, c, _mm512_set1_epi32(y)) }
        }
    }

    /// Whether [`QUANTIZER`] runs on this CPU (AVX-512 F and BW).
    pub(in crate::backend::cpu) fn quantizer_supported() -> bool {
        std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw")
    }

    /// BitNet's per-row quantization loops (`ternary::quantize_row_absmax`) in 16 lanes,
    /// bit-equal to the portable ones. Use only after [`quantizer_supported`].
    pub(in crate::backend::cpu) const QUANTIZER: Quantizer = Quantizer {
        abs_max_bits,
        round_finite,
    };

    /// The largest `bits & 0x7FFF_FFFF` of `x`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn abs_max_bits(x: &[f32]) -> u32 {
        let chunks = x.chunks_exact(16);
        let tail = chunks.remainder();
        let mask = _mm512_set1_epi32(0x7FFF_FFFF);
        let mut m = _mm512_setzero_si512();
        for c in chunks {
            // SAFETY: 16 readable f32.
            let v = unsafe { _mm512_loadu_si512(c.as_ptr() as *const _) };
            m = _mm512_max_epu32(m, _mm512_and_si512(v, mask));
        }
        let m = _mm512_reduce_max_epu32(m) as u32;
        tail.iter().fold(m, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF))
    }

    /// `q[i] = round_clamp_finite(x[i] · scale)` (finite `x`, `scale`): the same multiply,
    /// clamp and magic-constant rounding; `vpmovdb` truncates the in-range integers to bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn round_finite(x: &[f32], scale: f32, q: &mut [i8]) {
        let n = x.len().min(q.len());
        let (s, lo, hi) = (
            _mm512_set1_ps(scale),
            _mm512_set1_ps(-128.0),
            _mm512_set1_ps(127.0),
        );
        let magic = _mm512_set1_ps(ROUND_MAGIC);
        let magic_bits = _mm512_set1_epi32(ROUND_MAGIC.to_bits() as i32);
        let mut i = 0;
        while i + 16 <= n {
            // SAFETY: i + 16 ≤ n ≤ both lengths. Finite operands: min/max clamp as `clamp`.
            unsafe {
                let v = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(i)), s);
                let v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
                let r = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(v, magic)), magic_bits);
                _mm_storeu_si128(
                    q.as_mut_ptr().add(i) as *mut __m128i,
                    _mm512_cvtepi32_epi8(r),
                );
            }
            i += 16;
        }
        for (q, &v) in q[i..n].iter_mut().zip(&x[i..n]) {
            *q = round_clamp_finite(v * scale);
        }
    }

    crate::backend::cpu::ternary::ternary_table!(
        isa: Isa::Avx512,
        token: Avx512Ternary,
        attr: [#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni")]],
        mr: 8,
        tiles: [(1, 4) (2, 2) (3, 1) (4, 1) (5, 1) (6, 1) (7, 1) (8, 1)],
        mr8: 8,
        int8_tiles: [1 2 3 4 5 6 7 8],
    );
}

/// AVX2: the 8-row token and its table.
pub(in crate::backend::cpu) mod avx2 {
    use super::*;
    use crate::backend::cpu::detect::Isa;

    /// Proof that AVX2 is available; zero-sized.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Avx2Ternary {
        _proof: (),
    }

    impl Avx2Ternary {
        /// # Safety
        /// The CPU must support AVX2.
        #[inline(always)]
        pub(crate) unsafe fn new_unchecked() -> Self {
            Avx2Ternary { _proof: () }
        }
    }

    // SAFETY (every `unsafe` block in this impl): holding an `Avx2Ternary` token proves the CPU
    // has AVX2 (see `new_unchecked`); pointer methods forward their callers' bounds contract.
    impl TSimd for Avx2Ternary {
        const ROWS: usize = 8;
        // 15 chunks · 4 dots · 512 = 30720 < 32767 (see the module documentation).
        const FLUSH: usize = 15;
        type I = __m256i;
        type A = __m256i;

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
        fn zero_a(self) -> __m256i {
            self.zero()
        }
        #[inline(always)]
        fn codes<const SH: u32>(self, v: __m256i) -> __m256i {
            // SAFETY: token. As in the AVX-512 token.
            unsafe {
                let m = _mm256_set1_epi8(3);
                match SH {
                    0 => _mm256_and_si256(v, m),
                    1 => _mm256_and_si256(_mm256_srli_epi32::<2>(v), m),
                    2 => _mm256_and_si256(_mm256_srli_epi32::<4>(v), m),
                    _ => _mm256_and_si256(_mm256_srli_epi32::<6>(v), m),
                }
            }
        }
        #[inline(always)]
        fn dot(self, a: __m256i, c: __m256i, y: i32) -> __m256i {
            // SAFETY: token. Codes ≤ 2: a pair is at most 512 in magnitude, no saturation.
            unsafe { _mm256_add_epi16(a, _mm256_maddubs_epi16(c, _mm256_set1_epi32(y))) }
        }
        #[inline(always)]
        fn widen(self, acc: __m256i, a: __m256i) -> __m256i {
            // SAFETY: token.
            unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, _mm256_set1_epi16(1))) }
        }
        #[inline(always)]
        fn sub_splat(self, acc: __m256i, s: i32) -> __m256i {
            // SAFETY: token.
            unsafe { _mm256_sub_epi32(acc, _mm256_set1_epi32(s)) }
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut i32, v: __m256i) {
            // SAFETY: token; 8 writable i32 (caller).
            unsafe { _mm256_storeu_si256(p as *mut _, v) }
        }
        #[inline(always)]
        fn prefetch(self, p: *const u8) {
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p as *const i8) }
        }
        const SIGNED8: bool = true;
        #[inline(always)]
        fn dot8(self, acc: __m256i, c: __m256i, y: i32) -> __m256i {
            // SAFETY: token. The value `code − 128` (flipping the top bit) is in -127..=127, so
            // its magnitude fits u8 and moving its sign onto the activation (|y| ≤ 127) keeps
            // each product; a pair of them is at most 2 · 127 · 127 = 32258, below the i16
            // saturation of `vpmaddubsw`.
            unsafe {
                let v = _mm256_xor_si256(c, _mm256_set1_epi8(i8::MIN));
                let y = _mm256_sign_epi8(_mm256_set1_epi32(y), v);
                let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(v), y);
                _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
            }
        }
    }

    crate::backend::cpu::ternary::ternary_table!(
        isa: Isa::Avx2,
        token: Avx2Ternary,
        attr: [#[target_feature(enable = "avx2")]],
        mr: 4,
        tiles: [(1, 2) (2, 1) (3, 1) (4, 1)],
        mr8: 4,
        int8_tiles: [1 2 3 4],
    );
}
