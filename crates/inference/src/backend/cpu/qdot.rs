//! Products with quantized weight matrices ([`QuantMatrix`](super::QuantMatrix), in the
//! layout of `repack`): the integer-SIMD vocabulary `QSimd`, the per-instruction-set tables of
//! tile kernels ([`QTable`], filled by the `quant_table!` macro from the generic tiles of
//! `qkernels`), the portable implementation, and the threaded driver `qmatmul`.
//!
//! Driver: the activations are quantized once per call (`QActs`); output rows (weight rows)
//! are split over rayon workers in whole groups of 16; each worker takes the activation rows
//! in blocks that fit the L2 (512 KiB of codes) and, per block, walks its groups, running the
//! block's rows in tiles of 6 (4 for Q6_K) against each group, whose weights (a few
//! KB) stay in L1 meanwhile. At `m = 1` this streams the weights once (memory bound); at
//! larger `m` each weight vector loaded serves 4-6 rows from registers.
//!
//! Selection: AVX-512 with VNNI and BW (`vpdpbusd`), else AVX2 + FMA + F16C, else portable;
//! made once per process, like `dispatch`. All three give bit-identical results.

use std::sync::OnceLock;

use super::detect::Isa;
use super::repack::{record_bytes, GROUP_ROWS};
use super::threads::{self, OutPtr};
use crate::quant::act::{quantize_act_row, QActs};
use crate::quant::QuantType;

/// Integer-and-float vector vocabulary of the quantized tiles: `ROWS` i32 lanes, one per
/// weight row of a group half (16 for AVX-512, 8 for AVX2, 16 portable).
///
/// Tokens are zero-sized proofs that the CPU supports the instruction set, as in `simd`.
/// Pointer methods are `unsafe`: the caller guarantees the bytes read or written are in bounds.
pub(crate) trait QSimd: Copy {
    /// i32 lanes per vector.
    const ROWS: usize;
    /// `ROWS` i32 lanes (also seen as bytes or i16 pairs).
    type I: Copy;
    /// `ROWS` f32 lanes.
    type F: Copy;
    /// Loads `4 · ROWS` bytes.
    unsafe fn load(self, p: *const u8) -> Self::I;
    /// All lanes zero.
    fn zero(self) -> Self::I;
    /// All i32 lanes `x`.
    fn splat(self, x: i32) -> Self::I;
    /// Bitwise and.
    fn and(self, a: Self::I, b: Self::I) -> Self::I;
    /// Bitwise or.
    fn or(self, a: Self::I, b: Self::I) -> Self::I;
    /// Logical right shift of each 16-bit lane.
    fn srl16<const N: u32>(self, a: Self::I) -> Self::I;
    /// Left shift of each 16-bit lane.
    fn sll16<const N: u32>(self, a: Self::I) -> Self::I;
    /// i32 add (wrapping).
    fn add(self, a: Self::I, b: Self::I) -> Self::I;
    /// i32 multiply, low 32 bits.
    fn mullo(self, a: Self::I, b: Self::I) -> Self::I;
    /// `acc + Σ_{i<4} u8(c.byte[4l+i]) · i8(y.byte[i])` per lane `l`; codes must be below 64.
    fn dot(self, acc: Self::I, c: Self::I, y: i32) -> Self::I;
    /// As [`QSimd::dot`] for any unsigned code (0..=255).
    fn dot_u8(self, acc: Self::I, c: Self::I, y: i32) -> Self::I;
    /// `acc + Σ_{i<2} i16(p.half[2l+i]) · i16(y.half[i])` per lane `l`.
    fn dot_i16(self, acc: Self::I, p: Self::I, y: i32) -> Self::I;
    /// `2 · ROWS` bytes zero-extended to i16 (pairs per lane).
    unsafe fn load_u8x2_i16(self, p: *const u8) -> Self::I;
    /// `ROWS` bytes zero-extended to i32.
    unsafe fn load_u8_i32(self, p: *const u8) -> Self::I;
    /// `ROWS` bytes sign-extended to i32.
    unsafe fn load_i8_i32(self, p: *const u8) -> Self::I;
    /// `ROWS` little-endian f16 converted to f32.
    unsafe fn load_f16(self, p: *const u8) -> Self::F;
    /// All f32 lanes zero.
    fn zero_f(self) -> Self::F;
    /// All f32 lanes `x`.
    fn splat_f(self, x: f32) -> Self::F;
    /// i32 to f32 (round to nearest).
    fn cvt(self, a: Self::I) -> Self::F;
    /// `a · b`.
    fn mul_f(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c` with one rounding.
    fn fma_f(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Stores `ROWS` floats.
    unsafe fn store_f(self, p: *mut f32, v: Self::F);
}

/// A tile kernel: `(group records, activations, first activation row, rows, out)`, writing
/// `rows × 16` floats (row stride 16); `rows` is 1..=[`QTable::rows`]. See `qkernels`.
pub(crate) type Tile = unsafe fn(*const u8, &QActs, usize, usize, *mut f32);

/// Activation rows of one call of the vector tiles (`qkernels`), but Q6_K's: 12 independent
/// i32 accumulators.
pub(crate) const VECTOR_TILE_ROWS: usize = 6;

/// One instruction set's quantized tiles.
#[derive(Clone, Copy)]
pub struct QTable {
    pub(crate) isa: Isa,
    pub(crate) q4_0: Tile,
    pub(crate) q4_1: Tile,
    pub(crate) q5_0: Tile,
    pub(crate) q8_0: Tile,
    pub(crate) q4_k: Tile,
    pub(crate) q6_k: Tile,
    /// Activation rows of one `q8_0` tile call ([`VECTOR_TILE_ROWS`], or 16 on AMX-INT8).
    pub(crate) q8_0_rows: usize,
}

impl std::fmt::Debug for QTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QTable").field("isa", &self.isa).finish()
    }
}

impl QTable {
    /// The instruction set of these kernels.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Activation rows per tile call for weights of type `t`: [`VECTOR_TILE_ROWS`], 4 for Q6_K
    /// (5 live accumulators per row), 16 for Q8_0 on AMX-INT8.
    pub(crate) fn rows(&self, t: QuantType) -> usize {
        match t {
            QuantType::Q6_K => 4,
            QuantType::Q8_0 => self.q8_0_rows,
            _ => VECTOR_TILE_ROWS,
        }
    }

    fn tile(&self, t: QuantType) -> Tile {
        match t {
            QuantType::Q4_0 => self.q4_0,
            QuantType::Q4_1 => self.q4_1,
            QuantType::Q5_0 => self.q5_0,
            QuantType::Q8_0 => self.q8_0,
            QuantType::Q4_K => self.q4_k,
            QuantType::Q6_K => self.q6_k,
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("float type"),
        }
    }
}

/// Defines one entry point `$name` of a quantized table: `$attr` (the `#[target_feature]`
/// attribute, or nothing for the portable table), token `$tok`, generic tile `$body` of
/// `qkernels` (with its type tag `$t` for the legacy tile), dispatching on the row count.
macro_rules! qentry {
    ($name:ident, $tok:ty, [$($attr:tt)*], $body:ident, [$t:expr], [$($mr:literal)+]) => {
        $($attr)*
        unsafe fn $name(w: *const u8, a: &QActs, r0: usize, mr: usize, out: *mut f32) {
            // SAFETY: reached only through this module's `QTABLE`, handed out only after
            // detecting the features; the driver upholds the tile contract (mr in range).
            unsafe {
                let s = <$tok>::new_unchecked();
                match mr {
                    $($mr => qk::$body::<$tok, { $t }, $mr>(s, w, a, r0, out),)+
                    _ => unreachable!("tile rows out of range"),
                }
            }
        }
    };
    ($name:ident, $tok:ty, [$($attr:tt)*], $body:ident, [], [$($mr:literal)+]) => {
        $($attr)*
        unsafe fn $name(w: *const u8, a: &QActs, r0: usize, mr: usize, out: *mut f32) {
            // SAFETY: as in the first arm.
            unsafe {
                let s = <$tok>::new_unchecked();
                match mr {
                    $($mr => qk::$body::<$tok, $mr>(s, w, a, r0, out),)+
                    _ => unreachable!("tile rows out of range"),
                }
            }
        }
    };
}
pub(super) use qentry;

/// Defines the entry points of one instruction set's tiles and its `QTABLE`. `$tok` is the
/// [`QSimd`] token type (with an `unsafe fn new_unchecked()`), `$attr` the `#[target_feature]`
/// attribute of the entry points (empty for the portable table).
macro_rules! quant_table {
    (isa: $isa:expr, token: $tok:ty, attr: [$($attr:tt)*] $(,)?) => {
        use $crate::backend::cpu::qdot::QTable;
        use $crate::backend::cpu::qkernels as qk;
        use $crate::quant::act::QActs;

        $crate::backend::cpu::qdot::qentry!(
            q4_0, $tok, [$($attr)*], tile_legacy, [qk::T_Q4_0], [1 2 3 4 5 6]
        );
        $crate::backend::cpu::qdot::qentry!(
            q4_1, $tok, [$($attr)*], tile_legacy, [qk::T_Q4_1], [1 2 3 4 5 6]
        );
        $crate::backend::cpu::qdot::qentry!(
            q5_0, $tok, [$($attr)*], tile_legacy, [qk::T_Q5_0], [1 2 3 4 5 6]
        );
        $crate::backend::cpu::qdot::qentry!(
            q8_0, $tok, [$($attr)*], tile_legacy, [qk::T_Q8_0], [1 2 3 4 5 6]
        );
        $crate::backend::cpu::qdot::qentry!(
            q4_k, $tok, [$($attr)*], tile_q4_k, [], [1 2 3 4 5 6]
        );
        $crate::backend::cpu::qdot::qentry!(q6_k, $tok, [$($attr)*], tile_q6_k, [], [1 2 3 4]);

        /// This instruction set's quantized tiles (handed out only after detection).
        pub(in $crate::backend::cpu) static QTABLE: QTable = QTable {
            isa: $isa,
            q4_0,
            q4_1,
            q5_0,
            q8_0,
            q4_k,
            q6_k,
            q8_0_rows: $crate::backend::cpu::qdot::VECTOR_TILE_ROWS,
        };
    };
}
pub(super) use quant_table;

/// Portable token: plain arrays of 16 lanes, no intrinsics; bit-identical to the SIMD tables.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portable16;

#[inline(always)]
fn map_i(a: [i32; 16], f: impl Fn(i32) -> i32) -> [i32; 16] {
    a.map(f)
}

#[inline(always)]
fn zip_i(a: [i32; 16], b: [i32; 16], f: impl Fn(i32, i32) -> i32) -> [i32; 16] {
    std::array::from_fn(|l| f(a[l], b[l]))
}

#[inline(always)]
fn zip_f(a: [f32; 16], b: [f32; 16], f: impl Fn(f32, f32) -> f32) -> [f32; 16] {
    std::array::from_fn(|l| f(a[l], b[l]))
}

/// Each 16-bit half of `x` through `f`.
#[inline(always)]
fn halves(x: i32, f: impl Fn(u16) -> u16) -> i32 {
    let x = x as u32;
    (f(x as u16) as u32 | ((f((x >> 16) as u16) as u32) << 16)) as i32
}

impl QSimd for Portable16 {
    const ROWS: usize = 16;
    type I = [i32; 16];
    type F = [f32; 16];

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> [i32; 16] {
        // SAFETY: 64 readable bytes at p (caller).
        std::array::from_fn(|l| unsafe { (p.add(4 * l) as *const i32).read_unaligned() })
    }
    #[inline(always)]
    fn zero(self) -> [i32; 16] {
        [0; 16]
    }
    #[inline(always)]
    fn splat(self, x: i32) -> [i32; 16] {
        [x; 16]
    }
    #[inline(always)]
    fn and(self, a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        zip_i(a, b, |x, y| x & y)
    }
    #[inline(always)]
    fn or(self, a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        zip_i(a, b, |x, y| x | y)
    }
    #[inline(always)]
    fn srl16<const N: u32>(self, a: [i32; 16]) -> [i32; 16] {
        map_i(a, |x| halves(x, |h| h >> N))
    }
    #[inline(always)]
    fn sll16<const N: u32>(self, a: [i32; 16]) -> [i32; 16] {
        map_i(a, |x| halves(x, |h| h << N))
    }
    #[inline(always)]
    fn add(self, a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        zip_i(a, b, |x, y| x.wrapping_add(y))
    }
    #[inline(always)]
    fn mullo(self, a: [i32; 16], b: [i32; 16]) -> [i32; 16] {
        zip_i(a, b, |x, y| x.wrapping_mul(y))
    }
    #[inline(always)]
    fn dot(self, acc: [i32; 16], c: [i32; 16], y: i32) -> [i32; 16] {
        self.dot_u8(acc, c, y)
    }
    #[inline(always)]
    fn dot_u8(self, acc: [i32; 16], c: [i32; 16], y: i32) -> [i32; 16] {
        let yb = y.to_le_bytes();
        zip_i(acc, c, |a, c| {
            let cb = c.to_le_bytes();
            (0..4).fold(a, |s, i| s.wrapping_add(cb[i] as i32 * yb[i] as i8 as i32))
        })
    }
    #[inline(always)]
    fn dot_i16(self, acc: [i32; 16], p: [i32; 16], y: i32) -> [i32; 16] {
        let (y0, y1) = (y as i16 as i32, (y >> 16) as i16 as i32);
        zip_i(acc, p, |a, p| {
            a.wrapping_add((p as i16 as i32) * y0 + ((p >> 16) as i16 as i32) * y1)
        })
    }
    #[inline(always)]
    unsafe fn load_u8x2_i16(self, p: *const u8) -> [i32; 16] {
        // SAFETY: 32 readable bytes at p (caller).
        std::array::from_fn(|l| unsafe {
            *p.add(2 * l) as i32 | ((*p.add(2 * l + 1) as i32) << 16)
        })
    }
    #[inline(always)]
    unsafe fn load_u8_i32(self, p: *const u8) -> [i32; 16] {
        // SAFETY: 16 readable bytes at p (caller).
        std::array::from_fn(|l| unsafe { *p.add(l) as i32 })
    }
    #[inline(always)]
    unsafe fn load_i8_i32(self, p: *const u8) -> [i32; 16] {
        // SAFETY: 16 readable bytes at p (caller).
        std::array::from_fn(|l| unsafe { *p.add(l) as i8 as i32 })
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u8) -> [f32; 16] {
        // SAFETY: 32 readable bytes at p (caller).
        std::array::from_fn(|l| unsafe {
            half::f16::from_bits(u16::from_le_bytes([*p.add(2 * l), *p.add(2 * l + 1)])).to_f32()
        })
    }
    #[inline(always)]
    fn zero_f(self) -> [f32; 16] {
        [0.0; 16]
    }
    #[inline(always)]
    fn splat_f(self, x: f32) -> [f32; 16] {
        [x; 16]
    }
    #[inline(always)]
    fn cvt(self, a: [i32; 16]) -> [f32; 16] {
        a.map(|x| x as f32)
    }
    #[inline(always)]
    fn mul_f(self, a: [f32; 16], b: [f32; 16]) -> [f32; 16] {
        zip_f(a, b, |x, y| x * y)
    }
    #[inline(always)]
    fn fma_f(self, a: [f32; 16], b: [f32; 16], c: [f32; 16]) -> [f32; 16] {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    #[inline(always)]
    unsafe fn store_f(self, p: *mut f32, v: [f32; 16]) {
        // SAFETY: 16 writable floats at p (caller).
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, 16) }
    }
}

mod portable_table {
    use super::Portable16;
    impl Portable16 {
        /// The portable token needs no proof; `unsafe` only to match the macro's call.
        #[inline(always)]
        pub(crate) unsafe fn new_unchecked() -> Self {
            Portable16
        }
    }
    super::quant_table!(isa: super::Isa::Scalar, token: Portable16, attr: []);
}

/// Whether this CPU runs the AVX-512 quantized table (AVX-512 F/BW/VL/VNNI + AVX2/FMA).
#[cfg(target_arch = "x86_64")]
fn avx512_q_supported() -> bool {
    Isa::Avx512.is_supported() && super::detect::avx512_vnni_supported()
}

/// Whether this CPU runs the AVX2 quantized table (AVX2 + FMA + F16C).
#[cfg(target_arch = "x86_64")]
fn avx2_q_supported() -> bool {
    Isa::Avx2.is_supported() && super::detect::f16c_supported()
}

/// The quantized table of `isa`, if this CPU supports it (AVX-512 also needs VNNI and BW).
pub fn qtable_for(isa: Isa) -> Option<&'static QTable> {
    match isa {
        Isa::Scalar => Some(&portable_table::QTABLE),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if avx512_q_supported() => Some(avx512_table()),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if avx2_q_supported() => Some(&super::x86::qdot_avx2::QTABLE),
        _ => None,
    }
}

/// The AVX-512 VNNI table, with the Q8_0 tile on AMX-INT8 where the CPU has it (bit-identical
/// results; `LATTICE_AMX=0` keeps VNNI).
#[cfg(target_arch = "x86_64")]
fn avx512_table() -> &'static QTable {
    static TABLE: OnceLock<QTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let vnni = super::x86::qdot_avx512::QTABLE;
        if super::x86::amx::int8_available() {
            QTable {
                q8_0: super::x86::amx::q8_0_tile,
                q8_0_rows: super::x86::amx::Q8_MR,
                ..vnni
            }
        } else {
            vnni
        }
    })
}

/// What runs the Q8_0 products of prompts on this CPU: `"amx-int8"`, or the instruction set
/// of the quantized table (`"avx512"`, `"avx2"`, `"scalar"`).
pub fn q8_0_kernel_name() -> &'static str {
    let t = qtable();
    if t.q8_0_rows > VECTOR_TILE_ROWS {
        "amx-int8"
    } else {
        t.isa.name()
    }
}

/// The best quantized table for this CPU, chosen once.
pub fn qtable() -> &'static QTable {
    static BEST: OnceLock<&'static QTable> = OnceLock::new();
    BEST.get_or_init(|| {
        Isa::ALL
            .into_iter()
            .find_map(qtable_for)
            .unwrap_or(&portable_table::QTABLE)
    })
}

/// Most activation rows of any table's tile call (the driver's output buffer).
const MAX_TILE_ROWS: usize = 16;

/// Activation code bytes per pass of a worker over its weight groups (see `qmatmul`).
const ACT_BLOCK_BYTES: usize = 512 << 10;

/// Weight bytes above which a matrix-vector product is spread over the workers.
const PAR_MIN_WEIGHT_BYTES: usize = 1 << 17;

/// `y[m × n] (+)= x[m × k] · Wᵀ` for `W` (`n × k`, type `t`, quantized) in the group layout
/// `w` of `repack`; rows of `y` are `ldy` apart (`ldy ≥ n`), and with `accumulate` the
/// product is added to `y`. Panics if the slices do not match the shapes (callers check).
#[allow(clippy::too_many_arguments)]
pub(crate) fn qmatmul(
    tab: &QTable,
    t: QuantType,
    n: usize,
    k: usize,
    w: &[u8],
    x: &[f32],
    m: usize,
    y: &mut [f32],
    ldy: usize,
    accumulate: bool,
) {
    let nb = k / t.block_len();
    let rec = record_bytes(t);
    let groups = n.div_ceil(GROUP_ROWS);
    if m == 0 || n == 0 {
        return;
    }
    assert!(w.len() == groups * nb * rec && x.len() >= m * k && ldy >= n);
    assert!(y.len() >= (m - 1) * ldy + n);
    if k == 0 {
        if !accumulate {
            for row in 0..m {
                y[row * ldy..row * ldy + n].fill(0.0);
            }
        }
        return;
    }
    let acts = quantize_acts(t, x, m, k);
    debug_assert_eq!((acts.m, acts.k), (m, k));
    let tile = tab.tile(t);
    let yp = OutPtr(y.as_mut_ptr());
    let work = 2 * m * n * k;
    let nthreads = if work >= threads::PAR_MIN_FLOPS || w.len() >= PAR_MIN_WEIGHT_BYTES {
        threads::count()
    } else {
        1
    };
    let tr = tab.rows(t);
    debug_assert!(tr <= MAX_TILE_ROWS);
    // Activation rows per pass over the groups: as many as keep their codes (`mc · k` bytes)
    // in about half of a 1 MiB L2, a multiple of the tile height.
    let mc = ((ACT_BLOCK_BYTES / k).max(tr) / tr * tr).min(m.next_multiple_of(tr));
    threads::for_each_range(groups, 1, 1, nthreads, |g0, g1| {
        let mut buf = [0f32; MAX_TILE_ROWS * GROUP_ROWS];
        for m0 in (0..m).step_by(mc) {
            let m1 = (m0 + mc).min(m);
            for g in g0..g1 {
                let wg = &w[g * nb * rec..(g + 1) * nb * rec];
                let cols = GROUP_ROWS.min(n - g * GROUP_ROWS);
                let mut r0 = m0;
                while r0 < m1 {
                    let mr = tr.min(m1 - r0);
                    // SAFETY: `wg` holds this group's `nb` records; `acts` has rows
                    // r0..r0+mr quantized for `t`; `buf` holds 6 × 16 floats. The table was
                    // handed out by `qtable`/`qtable_for` after detection.
                    unsafe { tile(wg.as_ptr(), &acts, r0, mr, buf.as_mut_ptr()) };
                    for r in 0..mr {
                        let src = &buf[GROUP_ROWS * r..GROUP_ROWS * r + cols];
                        // SAFETY: row r0+r < m, columns g·16..g·16+cols < n ≤ ldy: inside
                        // `y` (checked above); no other worker touches these columns.
                        unsafe {
                            let dst = yp.get().add((r0 + r) * ldy + g * GROUP_ROWS);
                            if accumulate {
                                for (c, v) in src.iter().enumerate() {
                                    *dst.add(c) += v;
                                }
                            } else if cols == GROUP_ROWS {
                                // A whole group: one fixed-size copy (vector moves, not a
                                // call to memcpy per row).
                                dst.cast::<[f32; GROUP_ROWS]>().write_unaligned(
                                    src.as_ptr().cast::<[f32; GROUP_ROWS]>().read(),
                                );
                            } else {
                                std::ptr::copy_nonoverlapping(src.as_ptr(), dst, cols);
                            }
                        }
                    }
                    r0 += mr;
                }
            }
        }
    });
}

/// One row's slices of a [`QActs`] as the parallel iterator yields them:
/// `(((x, qs), d), (s, corr))`.
type RowSlices<'a> = (
    ((&'a [f32], &'a mut [i8]), &'a mut [f32]),
    (&'a mut [f32], &'a mut [i32]),
);

/// The `m` rows of `x` (`m × k`) quantized for weights of type `t`, rows in parallel when
/// there is enough work to pay for waking the workers.
fn quantize_acts(t: QuantType, x: &[f32], m: usize, k: usize) -> QActs {
    use rayon::prelude::*;
    let mut a = QActs::zeroed(t, m, k);
    if m == 0 || k == 0 {
        return a;
    }
    let nb = a.scales_per_row();
    let corr_per_row = a.corr_per_row;
    let row = |(((x, qs), d), (s, corr)): RowSlices| quantize_act_row(t, x, qs, d, s, corr);
    // Chunk sizes that are never zero (empty arrays get one dummy chunk per row).
    let (sl, cl) = (if a.s.is_empty() { 1 } else { nb }, corr_per_row.max(1));
    let mut s_dummy = vec![0.0; if a.s.is_empty() { m } else { 0 }];
    let mut c_dummy = vec![0; if corr_per_row == 0 { m } else { 0 }];
    let s_buf = if a.s.is_empty() {
        &mut s_dummy
    } else {
        &mut a.s
    };
    let c_buf = if corr_per_row == 0 {
        &mut c_dummy
    } else {
        &mut a.corr
    };
    let rows = x[..m * k]
        .par_chunks(k)
        .zip(a.qs.par_chunks_mut(k))
        .zip(a.d.par_chunks_mut(nb))
        .zip(s_buf.par_chunks_mut(sl).zip(c_buf.par_chunks_mut(cl)));
    if m * k >= 1 << 15 {
        rows.with_min_len(4).for_each(row);
    } else {
        rows.with_min_len(m).for_each(row);
    }
    a
}
