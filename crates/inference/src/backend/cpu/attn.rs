//! Single-query (decode) attention of one grouped-query group: the `G` query heads that share a
//! key/value head, against that head's cached keys and values, read in place from the pages of
//! a [`KvView`] (f32 or f16 rows).
//!
//! Two passes over the cache, each row read once from memory for the whole group. Scores
//! `S[r][j] = q_r · k_j`, page segment by page segment (tiles of up to 4 query rows × 4 key rows
//! of SIMD accumulators, summed across lanes as a tree on AVX-512); then per row `scale` and the
//! exact softmax of `vector::softmax` (the engine's vector `exp`) over every visible row; then
//! `o_r += Σ_j S[r][j] · v_j`, segment by segment, in register tiles of up to 4 rows × 4 vectors
//! of columns over blocks of at most 32 value rows, which stay in cache meanwhile. A segment is
//! a run of rows inside one page, so a view of one page is walked exactly like a contiguous
//! buffer and a paged one costs a few more block boundaries, never a copy.
//! f16 rows are widened to f32 exactly on load (F16C / AVX-512F), so an f16 cache gives bit for
//! bit what the f32 kernel gives on the widened rows.
//!
//! Selection: AVX-512F, else AVX2 + FMA (+ F16C for f16 rows), else the portable code here;
//! made once per process like `dispatch`. Summation orders differ between instruction sets
//! (lanes), so results agree to rounding, not bit for bit.

use half::f16;
use std::fmt;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::detect::{f16c_supported, Isa};
use super::scalar;
pub use crate::state::{KvRows, KvView};

/// One decode group: `g` query rows of `hd` values against the rows `first..` of a key view and
/// a value view (the last row of the views is the newest token), reading columns
/// `col..col + hd` of each row (the group's key/value head).
#[derive(Clone, Copy, Debug)]
pub struct DecodeGroup {
    /// Query heads sharing the key/value head.
    pub g: usize,
    /// Features per head.
    pub hd: usize,
    /// First visible row (the sliding-window start; 0 without a window).
    pub first: usize,
    /// Column of the key/value head inside a row (`head · hd`).
    pub col: usize,
    /// Factor applied to every score before the softmax.
    pub scale: f32,
}

impl DecodeGroup {
    /// Returns the number of visible rows; panics unless `q`, the views and `out` hold the
    /// group (a caller bug).
    fn check(&self, q: &[f32], keys: &KvView<'_>, values: &KvView<'_>, out: &[f32]) -> usize {
        let (g, hd) = (self.g, self.hd);
        assert!(g > 0 && hd > 0, "decode attention of an empty group");
        assert!(
            q.len() >= g * hd && out.len() >= g * hd,
            "decode attention: q or out shorter than {g} rows of {hd}"
        );
        assert_eq!(
            keys.rows(),
            values.rows(),
            "decode attention: as many keys as values"
        );
        assert!(self.first < keys.rows(), "decode attention over no keys");
        for ld in [keys.ld(), values.ld()] {
            assert!(
                self.col + hd <= ld,
                "decode attention: columns {}..{} outside rows of {ld}",
                self.col,
                self.col + hd
            );
        }
        assert_eq!(
            keys.is_f16(),
            values.is_f16(),
            "decode attention: keys and values of different dtypes"
        );
        keys.rows() - self.first
    }
}

/// A stored row element the kernels read: f32 or f16.
trait Stored: Copy {
    /// The typed values of `rows` (panics on the other dtype; `DecodeGroup::check` rules that
    /// out).
    fn typed(rows: KvRows<'_>) -> &[Self];
    /// The value as f32 (exact).
    fn widen(self) -> f32;
}

impl Stored for f32 {
    fn typed(rows: KvRows<'_>) -> &[f32] {
        match rows {
            KvRows::F32(x) => x,
            KvRows::F16(_) => panic!("decode attention: f16 rows in an f32 view"),
        }
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Stored for f16 {
    fn typed(rows: KvRows<'_>) -> &[f16] {
        match rows {
            KvRows::F16(x) => x,
            KvRows::F32(_) => panic!("decode attention: f32 rows in an f16 view"),
        }
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// The values of one segment of `n ≥ 1` rows `ld` apart, from column `col` on, after checking
/// that they hold `hd` values per row: the check every raw-pointer walk of a segment relies on.
///
/// Panics if the page is too short (a caller bug: `KvView::new` already checks its pages).
#[inline(always)]
fn segment<E: Stored>(rows: KvRows<'_>, n: usize, ld: usize, col: usize, hd: usize) -> &[E] {
    let x = E::typed(rows);
    assert!(
        x.len() >= (n - 1) * ld + col + hd,
        "decode attention: page too short for its rows"
    );
    &x[col..]
}

/// Attention of one group: `out[r·hd..][..hd] = softmax(scale · q_r·Kᵀ) · V` for each of the
/// `g` query rows `q[r·hd..][..hd]`, over the rows `shape.first..` of `keys` and `values` (the
/// same number of rows, same dtype), read in place page by page. `scores` is scratch.
///
/// Panics if a slice or view does not hold the shape (see [`DecodeGroup`]), if no row is
/// visible, or if the dtypes differ.
pub fn decode_group(
    shape: &DecodeGroup,
    q: &[f32],
    keys: &KvView<'_>,
    values: &KvView<'_>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    table().run(shape, q, keys, values, scores, out)
}

/// One instruction set's decode kernels, to compare them (tests, benchmarks); [`decode_group`]
/// runs [`DecodeKernels::selected`].
#[derive(Clone, Copy)]
pub struct DecodeKernels(&'static Table);

impl DecodeKernels {
    /// The kernels [`decode_group`] runs on this CPU.
    pub fn selected() -> Self {
        Self(table())
    }

    /// The portable kernels (the reference of the SIMD ones).
    pub fn portable() -> Self {
        Self(&PORTABLE)
    }

    /// Every set of kernels this CPU can run, best first: `avx512`, `avx2+f16c`, `avx2` (f16
    /// rows on the portable code, as on a CPU without F16C), `portable`.
    pub fn available() -> Vec<Self> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::Avx512.is_supported() {
                all.push(Self(&x86::AVX512));
            }
            if Isa::Avx2.is_supported() {
                if f16c_supported() {
                    all.push(Self(&x86::AVX2_F16C));
                }
                all.push(Self(&x86::AVX2));
            }
        }
        all.push(Self(&PORTABLE));
        all
    }

    /// Short name: `avx512`, `avx2+f16c`, `avx2` or `portable`.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// [`decode_group`] with these kernels.
    pub fn run(
        self,
        shape: &DecodeGroup,
        q: &[f32],
        keys: &KvView<'_>,
        values: &KvView<'_>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        self.0.run(shape, q, keys, values, scores, out)
    }
}

impl fmt::Debug for DecodeKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A kernel: `(shape, q, keys, values, scores, out)`, for one dtype of rows.
type KernelFn = unsafe fn(&DecodeGroup, &[f32], &KvView<'_>, &KvView<'_>, &mut [f32], &mut [f32]);

/// One instruction set's decode kernels.
struct Table {
    name: &'static str,
    f32: KernelFn,
    f16: KernelFn,
}

impl Table {
    fn run(
        &self,
        shape: &DecodeGroup,
        q: &[f32],
        keys: &KvView<'_>,
        values: &KvView<'_>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let len = shape.check(q, keys, values, out);
        scores.clear();
        scores.resize(shape.g * len, 0.0);
        let kernel = if keys.is_f16() { self.f16 } else { self.f32 };
        // SAFETY: the table was chosen by `table()` / `DecodeKernels::available` (or is the
        // portable one) after checking the CPU features its functions need; `check` validated
        // q, out, the views' row counts, widths and dtypes against the shape, `scores` holds
        // `g · len` values, and the kernels check each page segment (`segment`) before walking
        // it with pointers.
        unsafe { kernel(shape, q, keys, values, scores, out) }
    }
}

/// The portable kernels.
static PORTABLE: Table = Table {
    name: "portable",
    f32: portable::<f32>,
    f16: portable::<f16>,
};

/// The best table for this CPU, chosen once.
fn table() -> &'static Table {
    static SELECTED: OnceLock<&'static Table> = OnceLock::new();
    SELECTED.get_or_init(|| DecodeKernels::available()[0].0)
}

/// The portable kernel over rows of `E`, segment by segment (the same sums in the same order
/// however the rows are paged).
///
/// # Safety
/// Plain Rust; `unsafe` only to fit the table's type. Expects `Table::run`'s checks.
unsafe fn portable<E: Stored>(
    sh: &DecodeGroup,
    q: &[f32],
    keys: &KvView<'_>,
    values: &KvView<'_>,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (g, hd, first, total) = (sh.g, sh.hd, sh.first, keys.rows());
    let len = total - first;
    let ld = keys.ld();
    for (r0, rows, n) in keys.segments(first..total) {
        let k = segment::<E>(rows, n, ld, sh.col, hd);
        for j in 0..n {
            let kr = &k[j * ld..j * ld + hd];
            for r in 0..g {
                let qr = &q[r * hd..(r + 1) * hd];
                scores[r * len + r0 - first + j] =
                    qr.iter().zip(kr).map(|(&a, &b)| a * b.widen()).sum();
            }
        }
    }
    for row in scores.chunks_exact_mut(len) {
        scalar::scale(row, sh.scale);
        scalar::softmax(row);
    }
    out[..g * hd].fill(0.0);
    let ld = values.ld();
    for (r0, rows, n) in values.segments(first..total) {
        let v = segment::<E>(rows, n, ld, sh.col, hd);
        for j in 0..n {
            let vr = &v[j * ld..j * ld + hd];
            for r in 0..g {
                let p = scores[r * len + r0 - first + j];
                for (o, &x) in out[r * hd..(r + 1) * hd].iter_mut().zip(vr) {
                    *o += p * x.widen();
                }
            }
        }
    }
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
    use super::{segment, DecodeGroup, KvView, Stored, Table};

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

    /// How a page segment is walked: `hd` features of rows `ld` apart, scores in rows of `len`.
    #[derive(Clone, Copy)]
    struct Walk {
        hd: usize,
        ld: usize,
        len: usize,
    }

    /// Scores of `NR` query rows starting at row `r` against the segment's keys `j0..j1`, `KB`
    /// at a time, into score columns `c + j0..c + j1`.
    ///
    /// # Safety
    /// `q` holds query rows `r..r + NR` (`hd` apart); `k + j·ld .. + hd` is readable for
    /// `j < j1`; the CPU supports `S` and `E`'s loads. (Scores are a checked slice.)
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn score_rows<S: SumTile, E: Elem<S>, const NR: usize, const KB: usize>(
        s: S,
        w: Walk,
        q: *const f32,
        k: *const E,
        r: usize,
        (j0, j1): (usize, usize),
        c: usize,
        scores: &mut [f32],
    ) {
        let Walk { hd, ld, len } = w;
        let qr = q.wrapping_add(r * hd);
        let mut j = j0;
        // SAFETY (block): key rows j..j + KB <= j1 and query rows r..r + NR, as the caller
        // guarantees.
        unsafe {
            while j + KB <= j1 {
                let d = dots::<S, E, NR, KB>(s, qr, k.add(j * ld), ld, hd);
                for (i, row) in d.iter().enumerate() {
                    scores[(r + i) * len + c + j..][..KB].copy_from_slice(row);
                }
                j += KB;
            }
            while j < j1 {
                let d = dots::<S, E, NR, 1>(s, qr, k.add(j * ld), ld, hd);
                for (i, row) in d.iter().enumerate() {
                    scores[(r + i) * len + c + j] = row[0];
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

    /// `out += P · V` for `NR` query rows starting at `r` and the segment's values
    /// `j0..j0 + nj`, weighed by score columns `c + j0..`.
    ///
    /// # Safety
    /// `out` holds output rows `r..r + NR` (`hd` apart); `v + j·ld .. + hd` is readable for
    /// `j < j0 + nj`; `c + j0 + nj <= len` and `r + NR` rows of `len` scores lie in `scores`;
    /// the CPU supports `S` and `E`'s loads.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn value_rows<S: SumTile, E: Elem<S>, const NR: usize, const DV: usize>(
        s: S,
        w: Walk,
        scores: &[f32],
        v: *const E,
        r: usize,
        (j0, nj): (usize, usize),
        c: usize,
        out: *mut f32,
    ) {
        let Walk { hd, ld, len } = w;
        let p = scores[r * len + c + j0..].as_ptr();
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

    /// The generic kernel (see the module comment), page segment by page segment.
    ///
    /// # Safety
    /// The CPU supports `S` and `E`'s loads; `Table::run`'s checks passed (`DecodeGroup::check`:
    /// q, out and the views hold the shape) and `scores` holds `g·len` values. Each segment is
    /// checked by `segment` before its rows are read through pointers.
    #[inline(always)]
    unsafe fn kernel<S: SumTile, E: Elem<S> + Stored>(
        s: S,
        sh: &DecodeGroup,
        q: &[f32],
        keys: &KvView<'_>,
        values: &KvView<'_>,
        scores: &mut [f32],
        out: &mut [f32],
    ) {
        let (g, hd, first, total) = (sh.g, sh.hd, sh.first, keys.rows());
        let len = total - first;
        let qp = q.as_ptr();
        // Query rows in tiles of 4, 2, 1; keys 4 (AVX-512, 32 registers) or 2 at a time. Key
        // blocks outer, so that a group of more than 4 query rows still reads each key row
        // from memory once.
        let w = Walk {
            hd,
            ld: keys.ld(),
            len,
        };
        for (r0, rows, n) in keys.segments(first..total) {
            let kp = segment::<E>(rows, n, w.ld, sh.col, hd).as_ptr();
            let c = r0 - first;
            // SAFETY (block): `segment` checked that rows j < n of `kp` span `j·ld .. + hd`;
            // query rows r < g lie within q (checked); score columns c + j < len.
            unsafe {
                for b0 in (0..n).step_by(KEY_BLOCK) {
                    let js = (b0, (b0 + KEY_BLOCK).min(n));
                    let mut r = 0;
                    while r < g {
                        let left = g - r;
                        if left >= 4 {
                            if S::LANES >= 16 {
                                score_rows::<S, E, 4, 4>(s, w, qp, kp, r, js, c, scores);
                            } else {
                                score_rows::<S, E, 4, 2>(s, w, qp, kp, r, js, c, scores);
                            }
                            r += 4;
                        } else if left >= 2 {
                            score_rows::<S, E, 2, 2>(s, w, qp, kp, r, js, c, scores);
                            r += 2;
                        } else {
                            score_rows::<S, E, 1, 2>(s, w, qp, kp, r, js, c, scores);
                            r += 1;
                        }
                    }
                }
            }
        }
        for row in scores.chunks_exact_mut(len) {
            vector::scale(s, row, sh.scale);
            vector::softmax(s, row);
        }
        out[..g * hd].fill(0.0);
        let op = out.as_mut_ptr();
        let w = Walk {
            hd,
            ld: values.ld(),
            len,
        };
        for (r0, rows, n) in values.segments(first..total) {
            let vp = segment::<E>(rows, n, w.ld, sh.col, hd).as_ptr();
            let c = r0 - first;
            // SAFETY (block): as for the keys; output rows r < g lie within out (checked).
            unsafe {
                let mut j0 = 0;
                while j0 < n {
                    let js = (j0, KEY_BLOCK.min(n - j0));
                    let mut r = 0;
                    while r < g {
                        let left = g - r;
                        if left >= 4 {
                            if S::LANES >= 16 {
                                value_rows::<S, E, 4, 4>(s, w, scores, vp, r, js, c, op);
                            } else {
                                value_rows::<S, E, 4, 2>(s, w, scores, vp, r, js, c, op);
                            }
                            r += 4;
                        } else if left >= 2 {
                            value_rows::<S, E, 2, 2>(s, w, scores, vp, r, js, c, op);
                            r += 2;
                        } else {
                            value_rows::<S, E, 1, 4>(s, w, scores, vp, r, js, c, op);
                            r += 1;
                        }
                    }
                    j0 += js.1;
                }
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
                keys: &KvView<'_>,
                values: &KvView<'_>,
                scores: &mut [f32],
                out: &mut [f32],
            ) {
                // SAFETY: reached only through a table handed out after detecting the
                // features; shape checked by `Table::run`.
                unsafe {
                    kernel::<$tok, $elem>(<$tok>::new_unchecked(), sh, q, keys, values, scores, out)
                }
            }
        };
    }

    entry!(avx512_f32, Avx512, "avx512f,avx2,fma", f32);
    entry!(avx512_f16, Avx512, "avx512f,avx2,fma", f16);
    entry!(avx2_f32, Avx2, "avx2,fma", f32);
    entry!(avx2_f16, Avx2, "avx2,fma,f16c", f16);

    /// AVX-512F (its f16 widening needs nothing more).
    pub(super) static AVX512: Table = Table {
        name: "avx512",
        f32: avx512_f32,
        f16: avx512_f16,
    };
    /// AVX2 + FMA + F16C.
    pub(super) static AVX2_F16C: Table = Table {
        name: "avx2+f16c",
        f32: avx2_f32,
        f16: avx2_f16,
    };
    /// AVX2 + FMA without F16C: f16 rows take the portable path.
    pub(super) static AVX2: Table = Table {
        name: "avx2",
        f32: avx2_f32,
        f16: super::portable::<f16>,
    };
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

    /// softmax(scale · q·Kᵀ)·V in f64 for one group over contiguous rows `ld` apart, from
    /// column `col`.
    fn reference(sh: &DecodeGroup, ld: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        let total = k.len() / ld;
        let mut out = vec![0.0; sh.g * sh.hd];
        for r in 0..sh.g {
            let s: Vec<f64> = (sh.first..total)
                .map(|j| {
                    (0..sh.hd)
                        .map(|d| q[r * sh.hd + d] as f64 * k[j * ld + sh.col + d] as f64)
                        .sum::<f64>()
                        * sh.scale as f64
                })
                .collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for (i, x) in s.iter().enumerate() {
                let j = sh.first + i;
                for d in 0..sh.hd {
                    out[r * sh.hd + d] += (x - m).exp() / z * v[j * ld + sh.col + d] as f64;
                }
            }
        }
        out
    }

    /// `rows` split into pages of `page_rows` rows (each page allocated whole, as in a pool).
    fn paged<T: Copy + Default>(rows: &[T], ld: usize, page_rows: usize) -> Vec<Vec<T>> {
        rows.chunks(page_rows * ld)
            .map(|c| {
                let mut p = c.to_vec();
                p.resize(page_rows * ld, T::default());
                p
            })
            .collect()
    }

    fn pages16(p: &[Vec<f16>], page_rows: usize, rows: usize, ld: usize) -> KvView<'_> {
        let pages = p.iter().map(|x| KvRows::F16(x)).collect();
        KvView::new(pages, page_rows, rows, ld)
    }

    fn run(t: DecodeKernels, sh: &DecodeGroup, q: &[f32], k: &KvView, v: &KvView) -> Vec<f32> {
        let mut out = vec![f32::NAN; sh.g * sh.hd];
        t.run(sh, q, k, v, &mut Vec::new(), &mut out);
        out
    }

    /// Every table against the f64 definition, f32 and f16 rows, contiguous and in pages of 7
    /// rows, on awkward sizes; the f16 kernels must equal the f32 kernels on the widened rows
    /// bit for bit.
    #[test]
    fn matches_definition_and_f16_is_exact_widening() {
        let tables = DecodeKernels::available();
        for &hd in &[64, 128, 256, 40] {
            for &g in &[1, 4, 8, 7] {
                for &(total, first) in &[(1, 0), (7, 0), (33, 5), (1000, 300)] {
                    // Rows strided as in a cache with 2 key/value heads, group at head 1.
                    let ld = 2 * hd;
                    let sh = DecodeGroup {
                        g,
                        hd,
                        first,
                        col: hd,
                        scale: 1.0 / (hd as f32).sqrt(),
                    };
                    let q = data(g * hd, 1);
                    let k = data(total * ld, 2);
                    let v = data(total * ld, 3);
                    let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
                    let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                    let kw: Vec<f32> = k16.iter().map(|h| h.to_f32()).collect();
                    let vw: Vec<f32> = v16.iter().map(|h| h.to_f32()).collect();
                    let want = reference(&sh, ld, &q, &k, &v);
                    let want16 = reference(&sh, ld, &q, &kw, &vw);
                    let (kp, vp) = (paged(&k16, ld, 7), paged(&v16, ld, 7));
                    let (kpv, vpv) = (pages16(&kp, 7, total, ld), pages16(&vp, 7, total, ld));
                    let c32 = |x| KvView::contiguous(KvRows::F32(x), ld);
                    let c16 = |x| KvView::contiguous(KvRows::F16(x), ld);
                    for &t in &tables {
                        let got = run(t, &sh, &q, &c32(&k), &c32(&v));
                        for (a, b) in got.iter().zip(&want) {
                            assert!(
                                (*a as f64 - b).abs() < 2e-5,
                                "{t:?} f32 hd {hd} g {g} total {total}: {a} vs {b}"
                            );
                        }
                        let got16 = run(t, &sh, &q, &c16(&k16), &c16(&v16));
                        // `avx2` (no F16C) reads f16 rows with the portable kernel.
                        let t32 = if t.name() == "avx2" {
                            DecodeKernels::portable()
                        } else {
                            t
                        };
                        let widened = run(t32, &sh, &q, &c32(&kw), &c32(&vw));
                        assert_eq!(got16, widened, "{t:?} f16 hd {hd} g {g} total {total}");
                        for (a, b) in got16.iter().zip(&want16) {
                            assert!((*a as f64 - b).abs() < 2e-5, "{t:?} f16 {a} vs {b}");
                        }
                        let paged16 = run(t, &sh, &q, &kpv, &vpv);
                        for (a, b) in paged16.iter().zip(&want16) {
                            assert!((*a as f64 - b).abs() < 2e-5, "{t:?} paged {a} vs {b}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside rows")]
    fn head_outside_rows_panics() {
        let sh = DecodeGroup {
            g: 1,
            hd: 4,
            first: 0,
            col: 2,
            scale: 1.0,
        };
        let rows = [0.0; 12];
        let view = KvView::contiguous(KvRows::F32(&rows), 4);
        decode_group(&sh, &[0.0; 4], &view, &view, &mut Vec::new(), &mut [0.0; 4]);
    }

    #[test]
    #[should_panic(expected = "different dtypes")]
    fn mixed_dtypes_panic() {
        let sh = DecodeGroup {
            g: 1,
            hd: 4,
            first: 0,
            col: 0,
            scale: 1.0,
        };
        let (a, b) = ([0.0f32; 8], [f16::ZERO; 8]);
        let (k, v) = (
            KvView::contiguous(KvRows::F32(&a), 4),
            KvView::contiguous(KvRows::F16(&b), 4),
        );
        decode_group(&sh, &[0.0; 4], &k, &v, &mut Vec::new(), &mut [0.0; 4]);
    }

    #[test]
    #[should_panic(expected = "no keys")]
    fn window_past_the_rows_panics() {
        let sh = DecodeGroup {
            g: 1,
            hd: 4,
            first: 2,
            col: 0,
            scale: 1.0,
        };
        let rows = [0.0; 8];
        let view = KvView::contiguous(KvRows::F32(&rows), 4);
        decode_group(&sh, &[0.0; 4], &view, &view, &mut Vec::new(), &mut [0.0; 4]);
    }
}
