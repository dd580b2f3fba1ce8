//! Single-query (decode) attention of one grouped-query group: the `G` query heads that share a
//! key/value head, against that head's cached keys and values, stored as f32 or f16.
//!
//! Two passes over the cache, each row read once from memory for the whole group: scores
//! `S[r][j] = q_r · k_j` (tiles of up to 4 query rows × 4 key rows of SIMD accumulators, summed
//! across lanes as a tree on AVX-512), then per row `scale` and the exact softmax of
//! `vector::softmax` (the engine's vector `exp`), then `o_r = Σ_j S[r][j] · v_j` in register
//! tiles of up to 4 rows × 4 vectors of columns over blocks of 32 value rows, which stay in
//! cache meanwhile.
//! f16 rows are widened to f32 exactly on load (F16C / AVX-512F), so an f16 cache gives bit for
//! bit what the f32 kernel gives on the widened rows.
//!
//! Selection: AVX-512F, else AVX2 + FMA (+ F16C for f16 rows), else the portable code here;
//! made once per process like `dispatch`. Summation orders differ between instruction sets
//! (lanes), so results agree to rounding, not bit for bit.

use half::f16;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::detect::{f16c_supported, Isa};
use super::scalar;
pub use crate::state::KvRows;

/// One decode group: `g` query rows of `hd` values against `len` cached rows.
#[derive(Clone, Copy, Debug)]
pub struct DecodeGroup {
    /// Query heads sharing the key/value head.
    pub g: usize,
    /// Features per head.
    pub hd: usize,
    /// Cached rows visible to the query.
    pub len: usize,
    /// Distance in values between consecutive cached rows.
    pub ld: usize,
    /// Factor applied to every score before the softmax.
    pub scale: f32,
}

impl DecodeGroup {
    /// Panics unless `q`, `k`, `v` and `out` hold the group (a caller bug).
    fn check(&self, q: &[f32], k: usize, v: usize, out: &[f32]) {
        let need = if self.len == 0 {
            0
        } else {
            (self.len - 1) * self.ld + self.hd
        };
        assert!(self.len > 0, "decode attention over no keys");
        assert!(self.ld >= self.hd, "decode attention: ld < hd");
        assert!(q.len() >= self.g * self.hd && out.len() >= self.g * self.hd);
        assert!(k >= need && v >= need, "decode attention: cache too short");
    }
}

/// Attention of one group: `out[r·hd..][..hd] = softmax(scale · q_r·Kᵀ) · V` for each of the
/// `g` query rows `q[r·hd..][..hd]`. `k` and `v` start at the group's first visible row (head
/// offset included), rows `ld` apart, and must be of the same dtype. `scores` is scratch.
///
/// Panics if a slice is too short for the shape, if `len` is 0, or if the dtypes differ.
pub fn decode_group(
    shape: &DecodeGroup,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    table().run(shape, q, k, v, scores, out)
}

/// The portable kernel (the reference of the SIMD ones), whatever this CPU supports.
pub fn decode_group_portable(
    shape: &DecodeGroup,
    q: &[f32],
    k: KvRows<'_>,
    v: KvRows<'_>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    PORTABLE.run(shape, q, k, v, scores, out)
}

/// Kernel over f32 rows: `(shape, q, k, v, scores, out)`.
type F32Fn = unsafe fn(&DecodeGroup, &[f32], &[f32], &[f32], &mut [f32], &mut [f32]);
/// Kernel over f16 rows.
type F16Fn = unsafe fn(&DecodeGroup, &[f32], &[f16], &[f16], &mut [f32], &mut [f32]);

/// One instruction set's decode kernels.
struct Table {
    f32: F32Fn,
    f16: F16Fn,
}

impl Table {
    fn run(
        &self,
        shape: &DecodeGroup,
        q: &[f32],
        k: KvRows<'_>,
        v: KvRows<'_>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        shape.check(q, k.len(), v.len(), out);
        scores.clear();
        scores.resize(shape.g * shape.len, 0.0);
        // SAFETY: the table was chosen by `table()` (or is the portable one) after checking the
        // CPU features its functions need; `check` validated every slice against the shape,
        // which is all the kernels' pointer arithmetic relies on.
        unsafe {
            match (k, v) {
                (KvRows::F32(k), KvRows::F32(v)) => (self.f32)(shape, q, k, v, scores, out),
                (KvRows::F16(k), KvRows::F16(v)) => (self.f16)(shape, q, k, v, scores, out),
                _ => panic!("decode attention: keys and values of different dtypes"),
            }
        }
    }
}

/// The portable kernels.
static PORTABLE: Table = Table {
    f32: portable_f32,
    f16: portable_f16,
};

/// The best table for this CPU, chosen once.
fn table() -> &'static Table {
    static SELECTED: OnceLock<&'static Table> = OnceLock::new();
    SELECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx512.is_supported() {
                return &x86::AVX512;
            }
            if Isa::Avx2.is_supported() {
                return if f16c_supported() {
                    &x86::AVX2_F16C
                } else {
                    &x86::AVX2
                };
            }
        }
        &PORTABLE
    })
}

/// Portable kernel over any row type widened by `load`.
fn portable<E: Copy>(
    sh: &DecodeGroup,
    q: &[f32],
    k: &[E],
    v: &[E],
    scores: &mut [f32],
    out: &mut [f32],
    load: impl Fn(E) -> f32,
) {
    let (g, hd, len, ld) = (sh.g, sh.hd, sh.len, sh.ld);
    for j in 0..len {
        let kr = &k[j * ld..j * ld + hd];
        for r in 0..g {
            let qr = &q[r * hd..(r + 1) * hd];
            scores[r * len + j] = qr.iter().zip(kr).map(|(&a, &b)| a * load(b)).sum();
        }
    }
    for row in scores.chunks_exact_mut(len) {
        scalar::scale(row, sh.scale);
        scalar::softmax(row);
    }
    out[..g * hd].fill(0.0);
    for j in 0..len {
        let vr = &v[j * ld..j * ld + hd];
        for r in 0..g {
            let p = scores[r * len + j];
            for (o, &x) in out[r * hd..(r + 1) * hd].iter_mut().zip(vr) {
                *o += p * load(x);
            }
        }
    }
}

/// # Safety
/// Plain Rust; `unsafe` only to fit the table's type.
unsafe fn portable_f32(
    sh: &DecodeGroup,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    s: &mut [f32],
    o: &mut [f32],
) {
    portable(sh, q, k, v, s, o, |x| x)
}

/// # Safety
/// Plain Rust; `unsafe` only to fit the table's type.
unsafe fn portable_f16(
    sh: &DecodeGroup,
    q: &[f32],
    k: &[f16],
    v: &[f16],
    s: &mut [f32],
    o: &mut [f32],
) {
    portable(sh, q, k, v, s, o, f16::to_f32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The AVX-512 and AVX2 instantiations of the generic kernel, and the f16 loads.

    use core::arch::x86_64::*;
    use half::f16;

    use super::super::simd::Simd;
    use super::super::vector;
    use super::super::x86::avx2::Avx2;
    use super::super::x86::avx512::Avx512;
    use super::{DecodeGroup, Table};

    /// A cached element type that a token can widen to a vector of f32.
    pub(super) trait Elem<S: Simd>: Copy {
        /// Loads `S::LANES` elements from `p` as f32.
        ///
        /// # Safety
        /// `p..p + LANES` must be readable, and the token's CPU must support the load.
        unsafe fn load(s: S, p: *const Self) -> S::V;
        /// Loads the first `n < LANES` elements from `p` (zeros elsewhere).
        ///
        /// # Safety
        /// `p..p + n` must be readable.
        unsafe fn load_part(s: S, p: *const Self, n: usize) -> S::V;
    }

    impl<S: Simd> Elem<S> for f32 {
        #[inline(always)]
        unsafe fn load(s: S, p: *const f32) -> S::V {
            // SAFETY: forwarded contract.
            unsafe { s.load_ptr(p) }
        }
        #[inline(always)]
        unsafe fn load_part(s: S, p: *const f32, n: usize) -> S::V {
            // SAFETY: forwarded contract.
            unsafe { s.load_part_ptr(p, n, 0.0) }
        }
    }

    /// Copies `n < 16` halves into a zero-padded buffer (tails only).
    ///
    /// # Safety
    /// `p..p + n` must be readable.
    #[inline(always)]
    unsafe fn pad16(p: *const f16, n: usize) -> [u16; 16] {
        let mut buf = [0u16; 16];
        for (i, b) in buf.iter_mut().enumerate().take(n) {
            // SAFETY: i < n, readable by the caller's contract; f16 is a transparent u16.
            *b = unsafe { p.add(i).read().to_bits() };
        }
        buf
    }

    impl Elem<Avx512> for f16 {
        #[inline(always)]
        unsafe fn load(_: Avx512, p: *const f16) -> __m512 {
            // SAFETY: the token proves AVX-512F (vcvtph2ps zmm); 16 halves (32 bytes) readable.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_part(_: Avx512, p: *const f16, n: usize) -> __m512 {
            // SAFETY: n halves readable (caller); the rest comes from a local buffer.
            unsafe {
                let buf = pad16(p, n);
                _mm512_cvtph_ps(_mm256_loadu_si256(buf.as_ptr().cast()))
            }
        }
    }

    impl Elem<Avx2> for f16 {
        #[inline(always)]
        unsafe fn load(_: Avx2, p: *const f16) -> __m256 {
            // SAFETY: only instantiated in the entry point compiled with F16C, which is
            // selected after detecting it; 8 halves (16 bytes) readable.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_part(_: Avx2, p: *const f16, n: usize) -> __m256 {
            // SAFETY: as above; n halves readable, the rest from a local buffer.
            unsafe {
                let buf = pad16(p, n);
                _mm256_cvtph_ps(_mm_loadu_si128(buf.as_ptr().cast()))
            }
        }
    }

    /// Horizontal sums of a tile of accumulators (one sum per vector).
    pub(super) trait SumTile: Simd {
        /// `acc[r][c]` summed over its lanes.
        #[inline(always)]
        fn sum_tile<const NR: usize, const KB: usize>(
            self,
            acc: [[Self::V; KB]; NR],
        ) -> [[f32; KB]; NR] {
            acc.map(|row| row.map(|a| self.reduce_add(a)))
        }
    }

    impl SumTile for Avx2 {}

    impl SumTile for Avx512 {
        /// A 4 × 4 tile (16 vectors) is summed as a tree that halves the vector count at each
        /// level: 30 shuffles and 15 additions for 16 sums, against 64 and 64 one at a time.
        #[inline(always)]
        fn sum_tile<const NR: usize, const KB: usize>(
            self,
            acc: [[__m512; KB]; NR],
        ) -> [[f32; KB]; NR] {
            if NR != 4 || KB != 4 {
                return acc.map(|row| row.map(|a| self.reduce_add(a)));
            }
            let mut v = [self.zero(); 16];
            for (r, row) in acc.iter().enumerate() {
                for (c, &a) in row.iter().enumerate() {
                    v[r * KB + c] = a;
                }
            }
            let mut lanes = [0.0f32; 16];
            // SAFETY: the token proves AVX-512F; the store writes the 16 floats of `lanes`.
            unsafe {
                // 256-bit halves: w[i] = [v2i.lo + v2i.hi, v2i+1.lo + v2i+1.hi].
                let w: [__m512; 8] = std::array::from_fn(|i| {
                    let (a, b) = (v[2 * i], v[2 * i + 1]);
                    _mm512_add_ps(
                        _mm512_shuffle_f32x4::<0x44>(a, b),
                        _mm512_shuffle_f32x4::<0xEE>(a, b),
                    )
                });
                // 128-bit blocks: block j of x[i] holds 4 partial sums of v[4i + j].
                let x: [__m512; 4] = std::array::from_fn(|i| {
                    let (c, d) = (w[2 * i], w[2 * i + 1]);
                    _mm512_add_ps(
                        _mm512_shuffle_f32x4::<0x88>(c, d),
                        _mm512_shuffle_f32x4::<0xDD>(c, d),
                    )
                });
                let y: [__m512; 2] = std::array::from_fn(|i| {
                    let (e, f) = (x[2 * i], x[2 * i + 1]);
                    _mm512_add_ps(
                        _mm512_shuffle_ps::<0x44>(e, f),
                        _mm512_shuffle_ps::<0xEE>(e, f),
                    )
                });
                // Lane 4b + t of z is the sum of v[4t + b].
                let z = _mm512_add_ps(
                    _mm512_shuffle_ps::<0x88>(y[0], y[1]),
                    _mm512_shuffle_ps::<0xDD>(y[0], y[1]),
                );
                _mm512_storeu_ps(lanes.as_mut_ptr(), z);
            }
            let mut out = [[0.0f32; KB]; NR];
            for (r, row) in out.iter_mut().enumerate() {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = lanes[4 * c + r];
                }
            }
            out
        }
    }

    /// Dot products of `NR` query rows (`q`, rows `hd` apart) with `KB` key rows (`k`, rows
    /// `ld` apart): `NR × KB` accumulators, so each vector loaded serves several products.
    ///
    /// # Safety
    /// `q..q + NR·hd` and `k + i·ld .. + hd` (`i < KB`) readable; the CPU supports `S` and
    /// `E`'s loads.
    #[inline(always)]
    unsafe fn dots<S: SumTile, E: Elem<S>, const NR: usize, const KB: usize>(
        s: S,
        q: *const f32,
        k: *const E,
        ld: usize,
        hd: usize,
    ) -> [[f32; KB]; NR] {
        let mut acc = [[s.zero(); KB]; NR];
        let full = hd - hd % S::LANES;
        let mut d = 0;
        // SAFETY (block): every offset is below hd (full vectors up to `full`, then `hd - full`
        // lanes), inside the rows the caller guarantees.
        unsafe {
            while d < full {
                let mut kv = [s.zero(); KB];
                for (i, x) in kv.iter_mut().enumerate() {
                    *x = E::load(s, k.add(i * ld + d));
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let qv = s.load_ptr(q.add(r * hd + d));
                    for (a, &x) in row.iter_mut().zip(&kv) {
                        *a = s.mul_add(qv, x, *a);
                    }
                }
                d += S::LANES;
            }
            if full < hd {
                let n = hd - full;
                let mut kv = [s.zero(); KB];
                for (i, x) in kv.iter_mut().enumerate() {
                    *x = E::load_part(s, k.add(i * ld + full), n);
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let qv = s.load_part_ptr(q.add(r * hd + full), n, 0.0);
                    for (a, &x) in row.iter_mut().zip(&kv) {
                        *a = s.mul_add(qv, x, *a);
                    }
                }
            }
        }
        s.sum_tile(acc)
    }

    /// Scores of `NR` query rows starting at row `r` against keys `j0..j1`, `KB` at a time.
    ///
    /// # Safety
    /// As [`kernel`], with `r + NR <= g` and `j1 <= len`.
    #[inline(always)]
    unsafe fn score_rows<S: SumTile, E: Elem<S>, const NR: usize, const KB: usize>(
        s: S,
        sh: &DecodeGroup,
        q: *const f32,
        k: *const E,
        r: usize,
        (j0, j1): (usize, usize),
        scores: &mut [f32],
    ) {
        let (hd, len, ld) = (sh.hd, sh.len, sh.ld);
        let qr = q.wrapping_add(r * hd);
        let mut j = j0;
        // SAFETY (block): rows j..j + KB < len of k and query rows r..r + NR < g are in bounds.
        unsafe {
            while j + KB <= j1 {
                let d = dots::<S, E, NR, KB>(s, qr, k.add(j * ld), ld, hd);
                for (i, row) in d.iter().enumerate() {
                    scores[(r + i) * len + j..][..KB].copy_from_slice(row);
                }
                j += KB;
            }
            while j < j1 {
                let d = dots::<S, E, NR, 1>(s, qr, k.add(j * ld), ld, hd);
                for (i, row) in d.iter().enumerate() {
                    scores[(r + i) * len + j] = row[0];
                }
                j += 1;
            }
        }
    }

    /// `o_r[d0..] += Σ_{j<nj} p_r[j] · v_j[d0..]` for `NR` output rows (`o`, rows `hd` apart,
    /// weights `p`, rows `len` apart) over `DV` vectors of columns, with the accumulators in
    /// registers for the whole run of keys. `lanes < LANES` (only with `DV == 1`) handles the
    /// last, partial vector.
    ///
    /// # Safety
    /// `o + r·hd + d0 ..` (`DV` vectors or `lanes`) writable, `p + r·len .. + nj` readable for
    /// `r < NR`, and `v + j·ld + d0 ..` readable for `j < nj`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn weigh_values<S: SumTile, E: Elem<S>, const NR: usize, const DV: usize>(
        s: S,
        o: *mut f32,
        hd: usize,
        p: *const f32,
        len: usize,
        v: *const E,
        ld: usize,
        nj: usize,
        lanes: usize,
    ) {
        let part = lanes < S::LANES;
        let mut acc = [[s.zero(); DV]; NR];
        // SAFETY (block): offsets as the caller guarantees.
        unsafe {
            for (r, row) in acc.iter_mut().enumerate() {
                for (c, a) in row.iter_mut().enumerate() {
                    let at = o.add(r * hd + c * S::LANES);
                    *a = if part {
                        s.load_part_ptr(at, lanes, 0.0)
                    } else {
                        s.load_ptr(at)
                    };
                }
            }
            for j in 0..nj {
                let mut vv = [s.zero(); DV];
                for (c, x) in vv.iter_mut().enumerate() {
                    let at = v.add(j * ld + c * S::LANES);
                    *x = if part {
                        E::load_part(s, at, lanes)
                    } else {
                        E::load(s, at)
                    };
                }
                for (r, row) in acc.iter_mut().enumerate() {
                    let w = s.splat(*p.add(r * len + j));
                    for (a, &x) in row.iter_mut().zip(&vv) {
                        *a = s.mul_add(w, x, *a);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate() {
                for (c, &a) in row.iter().enumerate() {
                    let at = o.add(r * hd + c * S::LANES);
                    if part {
                        s.store_part_ptr(at, lanes, a);
                    } else {
                        s.store_ptr(at, a);
                    }
                }
            }
        }
    }

    /// Keys per value block: the block's rows are reused from cache by every (rows, columns)
    /// tile of the output.
    const KEY_BLOCK: usize = 32;

    /// `out += P · V` for `NR` query rows starting at `r`, keys `j0..j0 + nj`.
    ///
    /// # Safety
    /// As [`kernel`], with `r + NR <= g` and `j0 + nj <= len`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn value_rows<S: SumTile, E: Elem<S>, const NR: usize, const DV: usize>(
        s: S,
        sh: &DecodeGroup,
        scores: &[f32],
        v: *const E,
        r: usize,
        j0: usize,
        nj: usize,
        out: *mut f32,
    ) {
        let (hd, len, ld) = (sh.hd, sh.len, sh.ld);
        let p = scores[r * len + j0..].as_ptr();
        let o = out.wrapping_add(r * hd);
        let vj = v.wrapping_add(j0 * ld);
        let mut d = 0;
        // SAFETY (block): columns below hd, rows as the caller guarantees.
        unsafe {
            while d + DV * S::LANES <= hd {
                weigh_values::<S, E, NR, DV>(s, o.add(d), hd, p, len, vj.add(d), ld, nj, S::LANES);
                d += DV * S::LANES;
            }
            while d < hd {
                let lanes = (hd - d).min(S::LANES);
                weigh_values::<S, E, NR, 1>(s, o.add(d), hd, p, len, vj.add(d), ld, nj, lanes);
                d += lanes;
            }
        }
    }

    /// The generic kernel (see the module comment). Slices were checked by `Table::run`.
    ///
    /// # Safety
    /// The CPU supports `S` and `E`'s loads; the slices hold the shape (`DecodeGroup::check`),
    /// `scores` holds `g·len` values.
    #[inline(always)]
    unsafe fn kernel<S: SumTile, E: Elem<S>>(
        s: S,
        sh: &DecodeGroup,
        q: &[f32],
        k: &[E],
        v: &[E],
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let (g, len) = (sh.g, sh.len);
        let (qp, kp, vp) = (q.as_ptr(), k.as_ptr(), v.as_ptr());
        // Query rows in tiles of 4, 2, 1; keys 4 (AVX-512, 32 registers) or 2 at a time.
        // SAFETY (block): rows j < len of k and v span `j·ld .. j·ld + hd`, within the slices
        // (checked); query rows r < g and output rows lie within q and out (checked).
        // Key blocks outer, so that a group of more than 4 query rows still reads each key row
        // from memory once.
        unsafe {
            for j0 in (0..len).step_by(KEY_BLOCK) {
                let js = (j0, (j0 + KEY_BLOCK).min(len));
                let mut r = 0;
                while r < g {
                    let left = g - r;
                    if left >= 4 {
                        if S::LANES >= 16 {
                            score_rows::<S, E, 4, 4>(s, sh, qp, kp, r, js, scores);
                        } else {
                            score_rows::<S, E, 4, 2>(s, sh, qp, kp, r, js, scores);
                        }
                        r += 4;
                    } else if left >= 2 {
                        score_rows::<S, E, 2, 2>(s, sh, qp, kp, r, js, scores);
                        r += 2;
                    } else {
                        score_rows::<S, E, 1, 2>(s, sh, qp, kp, r, js, scores);
                        r += 1;
                    }
                }
            }
        }
        for row in scores.chunks_exact_mut(len) {
            vector::scale(s, row, sh.scale);
            vector::softmax(s, row);
        }
        out[..g * sh.hd].fill(0.0);
        let op = out.as_mut_ptr();
        // SAFETY (block): as above.
        unsafe {
            let mut j0 = 0;
            while j0 < len {
                let nj = KEY_BLOCK.min(len - j0);
                let mut r = 0;
                while r < g {
                    let left = g - r;
                    if left >= 4 {
                        if S::LANES >= 16 {
                            value_rows::<S, E, 4, 4>(s, sh, scores, vp, r, j0, nj, op);
                        } else {
                            value_rows::<S, E, 4, 2>(s, sh, scores, vp, r, j0, nj, op);
                        }
                        r += 4;
                    } else if left >= 2 {
                        value_rows::<S, E, 2, 2>(s, sh, scores, vp, r, j0, nj, op);
                        r += 2;
                    } else {
                        value_rows::<S, E, 1, 4>(s, sh, scores, vp, r, j0, nj, op);
                        r += 1;
                    }
                }
                j0 += nj;
            }
        }
    }

    /// Defines a table's `#[target_feature]` entry points.
    macro_rules! entry {
        ($name:ident, $tok:ty, $feat:literal, $elem:ty) => {
            #[target_feature(enable = $feat)]
            unsafe fn $name(
                sh: &DecodeGroup,
                q: &[f32],
                k: &[$elem],
                v: &[$elem],
                scores: &mut [f32],
                out: &mut [f32],
            ) {
                // SAFETY: reached only through a table that `table()` hands out after
                // detecting the features; slices checked by `Table::run`.
                unsafe { kernel(<$tok>::new_unchecked(), sh, q, k, v, scores, out) }
            }
        };
    }

    entry!(avx512_f32, Avx512, "avx512f,avx2,fma", f32);
    entry!(avx512_f16, Avx512, "avx512f,avx2,fma", f16);
    entry!(avx2_f32, Avx2, "avx2,fma", f32);
    entry!(avx2_f16, Avx2, "avx2,fma,f16c", f16);

    /// AVX-512F (its f16 widening needs nothing more).
    pub(super) static AVX512: Table = Table {
        f32: avx512_f32,
        f16: avx512_f16,
    };
    /// AVX2 + FMA + F16C.
    pub(super) static AVX2_F16C: Table = Table {
        f32: avx2_f32,
        f16: avx2_f16,
    };
    /// AVX2 + FMA without F16C: f16 rows take the portable path.
    pub(super) static AVX2: Table = Table {
        f32: avx2_f32,
        f16: super::portable_f16,
    };
}

/// The decode kernels of a specific table, for tests: `"avx512"`, `"avx2"`, `"portable"`, or
/// `None` when this CPU cannot run it.
#[cfg(test)]
fn table_named(name: &str) -> Option<&'static Table> {
    match name {
        "portable" => Some(&PORTABLE),
        #[cfg(target_arch = "x86_64")]
        "avx512" if Isa::Avx512.is_supported() => Some(&x86::AVX512),
        #[cfg(target_arch = "x86_64")]
        "avx2" if Isa::Avx2.is_supported() && f16c_supported() => Some(&x86::AVX2_F16C),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let x = (i * 7919 + seed * 104_729) % 2003;
                (x as f32 / 1001.0 - 1.0) * 1.5
            })
            .collect()
    }

    /// softmax(scale · q·Kᵀ)·V in f64 for one group.
    fn reference(sh: &DecodeGroup, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        let mut out = vec![0.0; sh.g * sh.hd];
        for r in 0..sh.g {
            let s: Vec<f64> = (0..sh.len)
                .map(|j| {
                    (0..sh.hd)
                        .map(|d| q[r * sh.hd + d] as f64 * k[j * sh.ld + d] as f64)
                        .sum::<f64>()
                        * sh.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (j, x) in s.iter().enumerate() {
                for d in 0..sh.hd {
                    out[r * sh.hd + d] += (x - m).exp() / z * v[j * sh.ld + d] as f64;
                }
            }
        }
        out
    }

    fn run(t: &Table, sh: &DecodeGroup, q: &[f32], k: KvRows, v: KvRows) -> Vec<f32> {
        let mut out = vec![f32::NAN; sh.g * sh.hd];
        t.run(sh, q, k, v, &mut Vec::new(), &mut out);
        out
    }

    /// Every table against the f64 definition, f32 and f16 rows, on awkward sizes; the f16
    /// kernels must equal the f32 kernels on the widened rows bit for bit.
    #[test]
    fn matches_definition_and_f16_is_exact_widening() {
        let tables: Vec<(&str, &Table)> = ["portable", "avx512", "avx2"]
            .into_iter()
            .filter_map(|n| table_named(n).map(|t| (n, t)))
            .collect();
        assert!(!tables.is_empty());
        for &hd in &[64, 128, 256, 40] {
            for &g in &[1, 4, 8, 7] {
                for &len in &[1, 7, 33, 1000] {
                    // Rows strided as in a cache with 2 key/value heads, group at head 1.
                    let ld = 2 * hd;
                    let sh = DecodeGroup {
                        g,
                        hd,
                        len,
                        ld,
                        scale: 1.0 / (hd as f32).sqrt(),
                    };
                    let q = data(g * hd, 1);
                    let kall = data(len * ld, 2);
                    let vall = data(len * ld, 3);
                    let (k, v) = (&kall[hd..], &vall[hd..]);
                    let k16: Vec<f16> = kall.iter().map(|&x| f16::from_f32(x)).collect();
                    let v16: Vec<f16> = vall.iter().map(|&x| f16::from_f32(x)).collect();
                    let kw: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
                    let vw: Vec<f32> = v16.iter().map(|h| h.to_f32()).collect();
                    let want = reference(&sh, &q, k, v);
                    let want16 = reference(&sh, &q, &kw[hd..], &vw[hd..]);
                    for &(name, t) in &tables {
                        let got = run(t, &sh, &q, KvRows::F32(k), KvRows::F32(v));
                        for (a, b) in got.iter().zip(&want) {
                            assert!(
                                (*a as f64 - b).abs() < 2e-5,
                                "{name} f32 hd {hd} g {g} len {len}: {a} vs {b}"
                            );
                        }
                        let got16 =
                            run(t, &sh, &q, KvRows::F16(&k16[hd..]), KvRows::F16(&v16[hd..]));
                        let widened =
                            run(t, &sh, &q, KvRows::F32(&kw[hd..]), KvRows::F32(&vw[hd..]));
                        assert_eq!(got16, widened, "{name} f16 hd {hd} g {g} len {len}");
                        for (a, b) in got16.iter().zip(&want16) {
                            assert!((*a as f64 - b).abs() < 2e-5, "{name} f16 {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "cache too short")]
    fn short_cache_panics() {
        let sh = DecodeGroup {
            g: 1,
            hd: 4,
            len: 3,
            ld: 4,
            scale: 1.0,
        };
        decode_group(
            &sh,
            &[0.0; 4],
            KvRows::F32(&[0.0; 11]),
            KvRows::F32(&[0.0; 12]),
            &mut Vec::new(),
            &mut [0.0; 4],
        );
    }
}
