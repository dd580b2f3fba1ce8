//! Ternary weight matrices (BitNet b1.58: weights in {-1, 0, +1}) times int8 activations.
//!
//! This file owns [`TernaryMatrix`] (the packed layout), the vector vocabulary `TSimd` and the
//! generic tile written once over it, the portable table, the per-process selection of the
//! best table, the threaded driver, and BitNet's per-token activation quantization
//! ([`quantize_row_absmax`]). The AVX-512 VNNI and AVX2 tokens and tables are `x86/ternary`.
//!
//! Layout: rows in groups of 32 (the last one padded), `k` padded to a multiple of 16. Each
//! value is stored as the 2-bit code `w + 1` (0, 1 or 2; padding is 1, value 0). A group is a
//! run of 128-byte chunks, chunk `c` holding columns `16c..16c + 16` of its 32 rows: row `R`
//! at bytes `64·(R / 16) + 4·(R % 16) + i` (`i < 4`), whose bits `2s..2s + 2` are the code of
//! column `16c + 4s + i`. One 64-byte load thus gives 4 codes of each of 16 rows per 32-bit
//! lane; a shift by `2s` and a mask by 3 line them up with the 4 activation bytes
//! `16c + 4s..16c + 4s + 4`, which one broadcast puts in every lane, and a byte dot product
//! (`vpdpbusd`, or `vpmaddubsw` with 16-bit partial sums on AVX2) adds the 4 products into each
//! row's i32 lane: 16 rows at once, no horizontal reductions. The product is then
//! `Σ w·x = Σ code·x − Σ x`, with `Σ x` computed once per activation row. The matrix is read
//! front to back in one stream, and each broadcast serves the two halves of a group.
//!
//! Driver: weight groups are split over the rayon workers (and, when there are few groups and
//! many activation rows, the activation-row tiles too); a tile is one group times up to
//! `TTable::mr` activation rows. At `m = 1` this streams the weights once (memory bound); at
//! larger `m` the activation rows are walked in blocks that stay in the L2 while a group's
//! weights (`8·k` bytes) stay in L1 or L2.
//!
//! Selection: AVX-512 with BW, VL and VNNI, else AVX2, else portable; made once per process.
//! All give identical (exact integer) results.
//!
//! The chunk layout, the tables and the driver also serve [`super::int8::Int8Matrix`] (8-bit
//! codes, 4 columns per chunk): each table carries that file's tile too, and
//! [`matmul_chunks`] is the driver of both.

use std::sync::OnceLock;

use super::detect::Isa;
use super::threads::{self, OutPtr};
use crate::{Error, Result};

/// Weight rows per group.
pub(super) const GROUP: usize = 32;
/// Weight rows per 64-byte half of a chunk (one i32 lane each in a 512-bit vector).
pub(super) const HALF: usize = 16;
/// Columns per chunk (a chunk is the 128 bytes of 16 columns of one group's 32 rows).
const CHUNK: usize = 16;
/// Bytes per chunk.
pub(super) const CHUNK_BYTES: usize = 128;
/// Most activation rows per tile of any table (the AMX-INT8 tile's 32).
pub(super) const MAX_MR: usize = 32;
/// Activation bytes per pass of a worker over its weight groups (about half of a 1 MiB L2).
const ACT_BLOCK_BYTES: usize = 512 << 10;
/// Chunks ahead of the one being read that a tile prefetches (2 KiB).
pub(super) const PREFETCH_CHUNKS: usize = 16;
/// Packed weight bytes above which a product is spread over the workers.
const PAR_MIN_WEIGHT_BYTES: usize = 1 << 17;

/// One chunk, so that the packed weights are cache-line aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Chunk(pub(super) [u8; CHUNK_BYTES]);

/// A ternary weight matrix `[n_rows, k]` (values -1, 0, +1), packed 2 bits per value in the
/// kernel layout (see the module documentation). `Debug` shows the shape, not the values.
#[derive(Clone)]
pub struct TernaryMatrix {
    n: usize,
    k: usize,
    /// Chunks per group (`k` rounded up to a multiple of 16, over 16).
    nch: usize,
    /// `ceil(n / 32)` groups of `nch` chunks.
    data: Vec<Chunk>,
}

impl std::fmt::Debug for TernaryMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (n, k) = (self.n, self.k);
        write!(
            f,
            "TernaryMatrix {{ n_rows: {n}, k: {k}, packed_bytes: {} }}",
            self.packed_bytes()
        )
    }
}

impl TernaryMatrix {
    /// From row-major values in {-1, 0, 1}; any `n_rows >= 1` and `k >= 1`.
    ///
    /// Fails ([`Error::Shape`]) on a zero dimension or when `values` is not `n_rows · k` long,
    /// and ([`Error::InvalidInput`]) on a value outside -1..=1.
    pub fn from_values(n_rows: usize, k: usize, values: &[i8]) -> Result<Self> {
        let op = "TernaryMatrix::from_values";
        check_shape(op, n_rows, k, values.len())?;
        if let Some(i) = values.iter().position(|v| !(-1..=1).contains(v)) {
            return Err(Error::InvalidInput(format!(
                "{op}: value {} at row {}, column {} is not -1, 0 or 1",
                values[i],
                i / k,
                i % k
            )));
        }
        let nch = k.div_ceil(CHUNK);
        // 0x55: code 1 (value 0) in all four slots of every byte (the padding rows).
        let mut data = vec![Chunk([0x55; CHUNK_BYTES]); n_rows.div_ceil(GROUP) * nch];
        let pack_group = |(g, chunks): (usize, &mut [Chunk])| {
            let rows = &values[g * GROUP * k..((g + 1) * GROUP).min(n_rows) * k];
            for (r, vals) in rows.chunks_exact(k).enumerate() {
                let o = row_offset(r);
                for (chunk, cols) in chunks.iter_mut().zip(vals.chunks(CHUNK)) {
                    let mut code = [1u8; CHUNK];
                    for (d, &v) in code.iter_mut().zip(cols) {
                        *d = (v + 1) as u8;
                    }
                    for i in 0..4 {
                        chunk.0[o + i] =
                            code[i] | code[4 + i] << 2 | code[8 + i] << 4 | code[12 + i] << 6;
                    }
                }
            }
        };
        use rayon::prelude::*;
        data.par_chunks_mut(nch)
            .enumerate()
            .with_min_len(64)
            .for_each(pack_group);
        Ok(TernaryMatrix {
            n: n_rows,
            k,
            nch,
            data,
        })
    }

    /// Rows (output features).
    pub fn n_rows(&self) -> usize {
        self.n
    }

    /// Columns (input features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes of packed weights one product streams (about `n_rows · k / 4`; rows padded to a
    /// multiple of 32, columns to a multiple of 16).
    pub fn packed_bytes(&self) -> usize {
        self.data.len() * CHUNK_BYTES
    }

    /// Unpacks row `row` into `out` (`k` long), values -1, 0 or 1.
    ///
    /// Panics if `row >= n_rows` or `out.len() != k` (a caller bug).
    pub fn row_values(&self, row: usize, out: &mut [i8]) {
        assert!(
            row < self.n && out.len() == self.k,
            "TernaryMatrix::row_values: row {row} of {}, out is {} (want {})",
            self.n,
            out.len(),
            self.k
        );
        let (g, o) = (row / GROUP, row_offset(row % GROUP));
        for (c, cols) in out.chunks_mut(CHUNK).enumerate() {
            let bytes = &self.data[g * self.nch + c].0[o..o + 4];
            for (j, v) in cols.iter_mut().enumerate() {
                *v = ((bytes[j % 4] >> (2 * (j / 4))) & 3) as i8 - 1;
            }
        }
    }

    /// Integer products `sums[r·ldy + o] = Σ_c x[r·k + c] · w[o][c]` for `r < m`,
    /// `o < n_rows` (exact i32; nothing else of `sums` is written). `x` holds `m` rows of `k`
    /// int8 activations. Threaded over output rows (and activation-row tiles when there are
    /// few weight rows) on the rayon pool, with the best kernels for this CPU.
    ///
    /// Panics if `x.len() != m · k`, `ldy < n_rows` or `sums` is shorter than
    /// `(m − 1) · ldy + n_rows` (a caller bug).
    pub fn matmul_i8(&self, x: &[i8], m: usize, sums: &mut [i32], ldy: usize) {
        matmul(table(), self, x, m, sums, ldy);
    }

    /// [`TernaryMatrix::matmul_i8`] with the kernels of a given instruction set (tests,
    /// benches); fails if this CPU does not support it. Panics as `matmul_i8`.
    pub fn matmul_i8_with(
        &self,
        isa: Isa,
        x: &[i8],
        m: usize,
        sums: &mut [i32],
        ldy: usize,
    ) -> Result<()> {
        let tab = table_for(isa).ok_or_else(|| {
            Error::InvalidInput(format!("instruction set {isa} not supported (ternary)"))
        })?;
        matmul(tab, self, x, m, sums, ldy);
        Ok(())
    }
}

/// Fails ([`Error::Shape`], naming `op`) unless `n_rows` and `k` are at least 1 and `len` is
/// `n_rows · k`.
pub(super) fn check_shape(op: &'static str, n_rows: usize, k: usize, len: usize) -> Result<()> {
    if n_rows == 0 || k == 0 {
        return Err(Error::Shape {
            op,
            reason: format!("{n_rows} × {k}: both dimensions must be at least 1"),
        });
    }
    if n_rows.checked_mul(k) != Some(len) {
        return Err(Error::Shape {
            op,
            reason: format!("{n_rows} × {k} values expected, got {len}"),
        });
    }
    Ok(())
}

/// The bytes of row `r` (< 32) of a group within each chunk start here.
pub(super) fn row_offset(r: usize) -> usize {
    64 * (r / HALF) + 4 * (r % HALF)
}

/// The magic constant of [`round_clamp`]: `1.5 · 2²³`.
pub(super) const ROUND_MAGIC: f32 = 12_582_912.0;

/// `clamp(round_half_to_even(v), -128, 127)` (NaN gives 0). Clamping first changes nothing
/// (the bounds are integers); then adding and subtracting `1.5 · 2²³` rounds half to even in
/// the default rounding mode, as `torch.round`, in plain SSE2 code the compiler vectorizes.
#[inline(always)]
fn round_clamp(v: f32) -> i8 {
    let v = v.clamp(-128.0, 127.0);
    ((v + ROUND_MAGIC) - ROUND_MAGIC) as i8
}

/// BitNet's per-token activation quantization of one row, as transformers'
/// `BitLinear.activation_quant`: `scale = 127 / max(max_i |x_i|, 1e-5)`,
/// `q_i = clamp(round_half_to_even(x_i · scale), -128, 127)` (one f32 multiply); returns
/// `scale`.
///
/// The scale is computed as torch computes `127 / tensor` (`Tensor.__rtruediv__` is
/// `reciprocal() * 127`): `(1 / max) · 127`, two f32 roundings, which differs from the f32
/// quotient in about a quarter of cases by one ulp (and then flips some half-way roundings).
/// Bit-exact against torch for finite input (a NaN in the row gives a NaN scale and zeros).
/// Panics if `q.len() != x.len()` (a caller bug).
pub fn quantize_row_absmax(x: &[f32], q: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::x86::ternary::avx512::quantizer_supported() {
        // SAFETY: the features were detected just now.
        return unsafe { quantize_row_absmax_in(x, q, super::x86::ternary::avx512::QUANTIZER) };
    }
    // SAFETY: the portable loops run anywhere.
    unsafe { quantize_row_absmax_in(x, q, PORTABLE_QUANTIZER) }
}

/// The two loops of [`quantize_row_absmax`]: the largest `bits & 0x7FFF_FFFF` of a row, and
/// [`round_clamp_finite`]`(x · scale)` of every value of a finite row.
#[derive(Clone, Copy)]
pub(super) struct Quantizer {
    pub(super) abs_max_bits: unsafe fn(&[f32]) -> u32,
    pub(super) round_finite: unsafe fn(&[f32], f32, &mut [i8]),
}

/// The portable loops (the compiler vectorizes them for the baseline target).
const PORTABLE_QUANTIZER: Quantizer = Quantizer {
    abs_max_bits: |x| x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF)),
    round_finite: |x, scale, q| {
        for (q, &v) in q.iter_mut().zip(x) {
            *q = round_clamp_finite(v * scale);
        }
    },
};

/// [`quantize_row_absmax`] with the loops of `k`.
///
/// # Safety
/// `k`'s functions must be supported by this CPU.
#[inline(always)]
unsafe fn quantize_row_absmax_in(x: &[f32], q: &mut [i8], k: Quantizer) -> f32 {
    assert_eq!(x.len(), q.len(), "quantize_row_absmax: lengths differ");
    // For non-NaN values the order of |x| is the order of its bits without the sign; a NaN
    // has larger bits than any number and propagates, as in torch.
    // SAFETY: supported (contract).
    let bits = unsafe { (k.abs_max_bits)(x) };
    let amax = f32::from_bits(bits);
    if amax.is_nan() {
        q.fill(0);
        return f32::NAN;
    }
    let scale = (1.0f32 / amax.max(1e-5)) * 127.0;
    if amax.is_infinite() {
        for (q, &v) in q.iter_mut().zip(x) {
            *q = round_clamp(v * scale);
        }
    } else {
        // Every value finite: the integer arithmetic form, which vectorizes.
        // SAFETY: supported (contract).
        unsafe { (k.round_finite)(x, scale, q) };
    }
    scale
}

/// [`round_clamp`] of a finite `v`, in integer arithmetic after the magic add: in
/// `[2²³, 2²⁴)` the ulp is 1, so the bits of `clamp(v) + 1.5 · 2²³` exceed those of the
/// constant by exactly the rounded integer (no float-to-int conversion, so it vectorizes).
#[inline(always)]
pub(super) fn round_clamp_finite(v: f32) -> i8 {
    let v = v.clamp(-128.0, 127.0);
    (v + ROUND_MAGIC)
        .to_bits()
        .wrapping_sub(ROUND_MAGIC.to_bits()) as i8
}

/// [`quantize_row_absmax`] over `m` rows of `k` (`x` and `q` are `m · k` long), rows in
/// parallel when large; returns the `m` scales.
///
/// Panics if `x` or `q` is not `m · k` long (a caller bug).
pub fn quantize_rows_absmax(x: &[f32], m: usize, k: usize, q: &mut [i8]) -> Vec<f32> {
    use rayon::prelude::*;
    assert!(
        x.len() == m * k && q.len() == m * k,
        "quantize_rows_absmax: x is {}, q is {} (want {m}·{k})",
        x.len(),
        q.len()
    );
    let mut scales = vec![0f32; m];
    // (Rows of k = 0 keep a zero scale.)
    let rows = x
        .par_chunks(k.max(1))
        .zip(q.par_chunks_mut(k.max(1)))
        .zip(&mut scales);
    let min_len = if m * k >= 1 << 16 { 1 } else { m.max(1) };
    rows.with_min_len(min_len)
        .for_each(|((x, q), s)| *s = quantize_row_absmax(x, q));
    scales
}

/// The vector vocabulary of the ternary tile: `ROWS` i32 lanes, one per weight row (16 for
/// AVX-512 and portable, 8 for AVX2: a group is then done as two halves).
///
/// Tokens are zero-sized proofs that the CPU supports the instruction set, as in `simd`.
/// Pointer methods are `unsafe`: the caller guarantees the bytes read or written are in bounds.
pub(crate) trait TSimd: Copy {
    /// i32 lanes (weight rows) per vector.
    const ROWS: usize;
    /// Chunks (4 [`TSimd::dot`]s each) a partial sum may take before [`TSimd::widen`].
    const FLUSH: usize;
    /// `ROWS` i32 lanes (also seen as bytes).
    type I: Copy;
    /// A partial sum ([`TSimd::dot`]'s accumulator; i16 pairs on AVX2).
    type A: Copy;
    /// Loads `4 · ROWS` bytes.
    unsafe fn load(self, p: *const u8) -> Self::I;
    /// All lanes zero.
    fn zero(self) -> Self::I;
    /// A zero partial sum.
    fn zero_a(self) -> Self::A;
    /// The codes in bits `2·SH..2·SH + 2` of each byte of `v`, as bytes (0..=3); `SH < 4`.
    fn codes<const SH: u32>(self, v: Self::I) -> Self::I;
    /// `a + Σ_{i<4} u8(c.byte[4l+i]) · i8(y.byte[i])` per lane `l` (bytes in memory order),
    /// codes at most 2.
    fn dot(self, a: Self::A, c: Self::I, y: i32) -> Self::A;
    /// `acc + a` as i32 lanes.
    fn widen(self, acc: Self::I, a: Self::A) -> Self::I;
    /// `acc − s` in every lane.
    fn sub_splat(self, acc: Self::I, s: i32) -> Self::I;
    /// Stores `ROWS` i32.
    unsafe fn store(self, p: *mut i32, v: Self::I);
    /// Hints that the cache line at `p` will be read soon (any address; never faults).
    #[inline(always)]
    fn prefetch(self, _p: *const u8) {}
    /// Whether [`TSimd::dot8`] multiplies the signed values `code − 128` (the int8 tile then
    /// needs no correction) or the codes themselves (the tile then subtracts `128 · Σ x`).
    const SIGNED8: bool;
    /// `acc + Σ_{i<4} v(c.byte[4l+i]) · i8(y.byte[i])` per i32 lane `l`, exact, where `v` is
    /// the 8-bit code (1..=255) or, when [`TSimd::SIGNED8`], `code − 128`; activation bytes in
    /// -127..=127.
    fn dot8(self, acc: Self::I, c: Self::I, y: i32) -> Self::I;
}

/// What a tile reads and writes (raw pointers: the driver checks every bound before).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TileArgs {
    /// The group's chunks.
    pub(crate) w: *const u8,
    /// Chunks in the group.
    pub(crate) nch: usize,
    /// The first activation row (`16 · nch` bytes, zero-padded); rows `ldx` bytes apart.
    pub(crate) x: *const i8,
    pub(crate) ldx: usize,
    /// `Σ x` of each activation row of the tile.
    pub(crate) xsum: *const i32,
    /// Output: activation row `r`, weight row `j` of the group at `out[r·ldo + j]`.
    pub(crate) out: *mut i32,
    pub(crate) ldo: usize,
}

/// [`TSimd::codes`] with a run-time slot `sh` (a constant after unrolling).
#[inline(always)]
fn codes<S: TSimd>(s: S, v: S::I, sh: usize) -> S::I {
    match sh {
        0 => s.codes::<0>(v),
        1 => s.codes::<1>(v),
        2 => s.codes::<2>(v),
        _ => s.codes::<3>(v),
    }
}

/// The tile: one group (32 rows) times `MR` activation rows over the full depth, with `P`
/// independent partial sums per output vector (more parallel chains when `MR` is small). The
/// two 16-row halves of the group (`G`) share each activation broadcast.
///
/// # Safety
/// `a.w` points at a group of `a.nch` chunks; `a.x` at `MR` rows of `16 · a.nch` bytes
/// (`a.ldx` apart), `a.xsum` at `MR` sums; `a.out` has room for `MR` rows of 32 i32 (`a.ldo`
/// apart).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index walks several per-row arrays
pub(crate) unsafe fn tile<S: TSimd, const MR: usize, const P: usize>(s: S, a: &TileArgs) {
    const G: usize = GROUP / HALF;
    // SAFETY (whole body): offsets stay inside the group and activation rows (contract).
    unsafe {
        // Vectors of fewer than 16 rows (AVX2) take each half in parts.
        for h in 0..HALF / S::ROWS {
            let lane = 4 * S::ROWS * h;
            let mut acc = [[s.zero(); MR]; G];
            let mut c0 = 0;
            while c0 < a.nch {
                let c1 = c0 + S::FLUSH.min(a.nch - c0);
                let mut part = [[[s.zero_a(); P]; MR]; G];
                for c in c0..c1 {
                    // The hardware prefetchers alone fall ~10% short of the DRAM bandwidth.
                    let ahead = a.w.wrapping_add(CHUNK_BYTES * (c + PREFETCH_CHUNKS));
                    s.prefetch(ahead);
                    s.prefetch(ahead.wrapping_add(64));
                    // (Loops, not closures: a closure would not inherit the target features.)
                    let mut w = [s.zero(); G];
                    for g in 0..G {
                        w[g] = s.load(a.w.add(CHUNK_BYTES * c + 64 * g + lane));
                    }
                    for sh in 0..4 {
                        let mut cv = [s.zero(); G];
                        for g in 0..G {
                            cv[g] = codes(s, w[g], sh);
                        }
                        for r in 0..MR {
                            // Four activation bytes as one i32 (memory order).
                            let y = a.x.add(r * a.ldx + CHUNK * c + 4 * sh);
                            let y = (y as *const i32).read_unaligned();
                            for g in 0..G {
                                let p = &mut part[g][r][sh % P];
                                *p = s.dot(*p, cv[g], y);
                            }
                        }
                    }
                }
                for g in 0..G {
                    for r in 0..MR {
                        for p in 0..P {
                            acc[g][r] = s.widen(acc[g][r], part[g][r][p]);
                        }
                    }
                }
                c0 = c1;
            }
            for g in 0..G {
                for r in 0..MR {
                    let v = s.sub_splat(acc[g][r], *a.xsum.add(r));
                    s.store(a.out.add(r * a.ldo + HALF * g + S::ROWS * h), v);
                }
            }
        }
    }
}

/// A table's entry point: `(args, activation rows (1..=mr))`.
pub(crate) type TKernel = unsafe fn(&TileArgs, usize);

/// One instruction set's ternary tile and int8 tile (`super::int8`).
pub(crate) struct TTable {
    pub(crate) isa: Isa,
    /// Most activation rows per ternary tile.
    pub(crate) mr: usize,
    pub(crate) kernel: TKernel,
    /// Most activation rows per int8 tile.
    pub(crate) mr8: usize,
    pub(crate) kernel8: TKernel,
}

/// Defines the entry point `kernel` of one instruction set's tiles and its `TTABLE`: `$tok` is
/// the [`TSimd`] token (with an `unsafe fn new_unchecked()`), `$attr` the `#[target_feature]`
/// attribute (empty for the portable table), `tiles` the `(rows, partial sums)` of each tile
/// height `1..=mr`, in order; `int8_tiles` the heights `1..=mr8` of the int8 tile.
macro_rules! ternary_table {
    (
        isa: $isa:expr,
        token: $tok:ty,
        attr: [$($attr:tt)*],
        mr: $mr:literal,
        tiles: [$(($m:literal, $p:literal))+],
        mr8: $mr8:literal,
        int8_tiles: [$($m8:literal)+] $(,)?
    ) => {
        use $crate::backend::cpu::int8::tile8;
        use $crate::backend::cpu::ternary::{tile, TTable, TileArgs};

        $($attr)*
        unsafe fn kernel(a: &TileArgs, mr: usize) {
            // SAFETY: reached only through this module's `TTABLE`, handed out only after
            // detecting the features; the driver upholds the tile contract.
            unsafe {
                let s = <$tok>::new_unchecked();
                match mr {
                    $($m => tile::<$tok, $m, $p>(s, a),)+
                    _ => unreachable!("tile rows out of range"),
                }
            }
        }

        $($attr)*
        unsafe fn kernel8(a: &TileArgs, mr: usize) {
            // SAFETY: as `kernel`.
            unsafe {
                let s = <$tok>::new_unchecked();
                match mr {
                    $($m8 => tile8::<$tok, $m8>(s, a),)+
                    _ => unreachable!("tile rows out of range"),
                }
            }
        }

        /// This instruction set's ternary and int8 tiles (handed out only after detection).
        pub(in $crate::backend::cpu) static TTABLE: TTable = TTable {
            isa: $isa,
            mr: $mr,
            kernel,
            mr8: $mr8,
            kernel8,
        };
    };
}
pub(super) use ternary_table;

/// Portable token: plain arrays of 16 lanes, no intrinsics.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Portable16;

impl TSimd for Portable16 {
    const ROWS: usize = 16;
    const FLUSH: usize = usize::MAX;
    type I = [u32; 16];
    type A = [i32; 16];

    #[inline(always)]
    unsafe fn load(self, p: *const u8) -> [u32; 16] {
        // SAFETY: 64 readable bytes at p (caller).
        unsafe { (p as *const [u32; 16]).read_unaligned() }.map(u32::from_le)
    }
    #[inline(always)]
    fn zero(self) -> [u32; 16] {
        [0; 16]
    }
    #[inline(always)]
    fn zero_a(self) -> [i32; 16] {
        [0; 16]
    }
    #[inline(always)]
    fn codes<const SH: u32>(self, v: [u32; 16]) -> [u32; 16] {
        v.map(|x| (x >> (2 * SH)) & 0x0303_0303)
    }
    #[inline(always)]
    fn dot(self, mut a: [i32; 16], c: [u32; 16], y: i32) -> [i32; 16] {
        for (i, yi) in y.to_ne_bytes().into_iter().enumerate() {
            for l in 0..16 {
                // Codes are at most 3: the product fits in i16 (a cheaper multiply).
                a[l] += (((c[l] >> (8 * i)) & 0xFF) as i16 * yi as i8 as i16) as i32;
            }
        }
        a
    }
    #[inline(always)]
    fn widen(self, acc: [u32; 16], a: [i32; 16]) -> [u32; 16] {
        std::array::from_fn(|l| acc[l].wrapping_add(a[l] as u32))
    }
    #[inline(always)]
    fn sub_splat(self, acc: [u32; 16], s: i32) -> [u32; 16] {
        acc.map(|x| x.wrapping_sub(s as u32))
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut i32, v: [u32; 16]) {
        // SAFETY: 16 writable i32 at p (caller).
        unsafe { (p as *mut [i32; 16]).write_unaligned(v.map(|x| x as i32)) }
    }
    const SIGNED8: bool = true;
    #[inline(always)]
    fn dot8(self, acc: [u32; 16], c: [u32; 16], y: i32) -> [u32; 16] {
        let y = y.to_ne_bytes().map(|b| b as i8 as i32);
        std::array::from_fn(|l| {
            let s: i32 = (0..4)
                .map(|i| (((c[l] >> (8 * i)) & 0xFF) as i32 - 128) * y[i])
                .sum();
            acc[l].wrapping_add(s as u32)
        })
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
    super::ternary_table!(
        isa: super::Isa::Scalar,
        token: Portable16,
        attr: [],
        mr: 4,
        tiles: [(1, 2) (2, 1) (3, 1) (4, 1)],
        mr8: 4,
        int8_tiles: [1 2 3 4],
    );
}

/// The ternary table of `isa`, if this CPU supports it (AVX-512 also needs BW, VL and VNNI).
pub(crate) fn table_for(isa: Isa) -> Option<&'static TTable> {
    match isa {
        Isa::Scalar => Some(&portable_table::TTABLE),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if isa.is_supported() && super::detect::avx512_vnni_supported() => {
            Some(&super::x86::ternary::avx512::TTABLE)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 if isa.is_supported() => Some(&super::x86::ternary::avx2::TTABLE),
        _ => None,
    }
}

/// The best ternary table for this CPU, chosen once.
pub(crate) fn table() -> &'static TTable {
    static BEST: OnceLock<&'static TTable> = OnceLock::new();
    BEST.get_or_init(|| {
        Isa::ALL
            .into_iter()
            .find_map(table_for)
            .unwrap_or(&portable_table::TTABLE)
    })
}

/// The instruction set of the ternary kernels [`TernaryMatrix::matmul_i8`] uses.
pub fn isa() -> Isa {
    table().isa
}

/// A matrix of chunks as the driver sees it: `n × k` values, groups of 32 rows of `nch`
/// chunks, `cols` columns per chunk.
#[derive(Clone, Copy)]
pub(super) struct ChunkView<'a> {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) nch: usize,
    pub(super) cols: usize,
    pub(super) data: &'a [Chunk],
}

/// The driver of [`TernaryMatrix::matmul_i8`] with the tiles of `tab`.
fn matmul(tab: &TTable, w: &TernaryMatrix, x: &[i8], m: usize, sums: &mut [i32], ldy: usize) {
    let view = ChunkView {
        n: w.n,
        k: w.k,
        nch: w.nch,
        cols: CHUNK,
        data: &w.data,
    };
    let out = TileOut::Sums(sums, ldy);
    matmul_chunks(
        tab.kernel,
        tab.mr,
        view,
        1,
        x,
        m,
        out,
        "TernaryMatrix::matmul_i8",
    );
}

/// Where the driver puts each tile's sums.
pub(super) enum TileOut<'a> {
    /// In place: `sums[r·ldy + o]` (`ldy ≥ n`, at least `(m − 1)·ldy + n` long).
    Sums(&'a mut [i32], usize),
    /// Handed over tile by tile: `(first activation row, first weight row, sums, columns)`,
    /// the sums `rows × 32` (row `r`'s first `columns` at `32·r`), each pair of row and 32-row
    /// group exactly once, from any worker.
    Sink(&'a TileSink<'a>),
}

/// The receiver of [`TileOut::Sink`]: `(first activation row, first weight row, sums, columns)`.
pub(super) type TileSink<'a> = dyn Fn(usize, usize, &[i32], usize) + Sync + 'a;

/// The driver of the chunked products: the sums `Σ_c x[r·k + c] · w[o][c]` from the tiles
/// `kernel` (at most `mr` activation rows each) over `w`, each tile given `xsum_mul · Σ x` per
/// activation row, into `out`. `op` names the caller in the panic on bad lengths (a caller bug).
#[allow(clippy::too_many_arguments)] // the product's operands, as the tiles take them
pub(super) fn matmul_chunks(
    kernel: TKernel,
    mr: usize,
    w: ChunkView<'_>,
    xsum_mul: i32,
    x: &[i8],
    m: usize,
    out: TileOut<'_>,
    op: &str,
) {
    let (n, k, nch) = (w.n, w.k, w.nch);
    assert!(x.len() == m * k, "{op}: x is {} (want {m}·{k})", x.len());
    if let TileOut::Sums(sums, ldy) = &out {
        assert!(
            *ldy >= n && (m == 0 || sums.len() >= (m - 1) * ldy + n),
            "{op}: sums is {} with ldy {ldy} (n = {n}, m = {m})",
            sums.len(),
        );
    }
    if m == 0 {
        return;
    }
    let kp = nch * w.cols;
    // Rows padded with zeros to whole chunks (a copy only when k is not a multiple of `cols`).
    let padded;
    let xs: &[i8] = if kp == k {
        x
    } else {
        let mut p = vec![0i8; m * kp];
        for (d, s) in p.chunks_exact_mut(kp).zip(x.chunks_exact(k)) {
            d[..k].copy_from_slice(s);
        }
        padded = p;
        &padded
    };
    let xsum: Vec<i32> = x
        .chunks_exact(k)
        .map(|r| xsum_mul * r.iter().map(|&v| v as i32).sum::<i32>())
        .collect();
    let groups = n.div_ceil(GROUP);
    let packed_bytes = w.data.len() * CHUNK_BYTES;
    let nthreads =
        if 2 * m * n * k >= threads::PAR_MIN_FLOPS || packed_bytes >= PAR_MIN_WEIGHT_BYTES {
            threads::count()
        } else {
            1
        };
    assert!(mr <= MAX_MR, "tile taller than the output buffer");
    let wdata: &[Chunk] = w.data;
    let (sums, ldy, sink) = match out {
        TileOut::Sums(sums, ldy) => (OutPtr(sums.as_mut_ptr()), ldy, None),
        TileOut::Sink(f) => (OutPtr(std::ptr::null_mut()), 0, Some(f)),
    };
    // One tile: group `g` times activation rows `r0..r0 + rows`.
    let run_tile = |g: usize, r0: usize, rows: usize| {
        let cols = GROUP.min(n - GROUP * g);
        let mut args = TileArgs {
            w: wdata[g * nch..].as_ptr() as *const u8,
            nch,
            x: xs[r0 * kp..].as_ptr(),
            ldx: kp,
            xsum: xsum[r0..].as_ptr(),
            out: sums.get(),
            ldo: ldy,
        };
        debug_assert!(rows <= mr && r0 + rows <= m);
        if cols == GROUP && sink.is_none() {
            // A whole group: the tile writes its rows' 32 sums in place.
            // SAFETY: group g < groups has `nch` chunks; `rows` activation rows of `kp` bytes
            // and their sums from r0 (r0 + rows ≤ m); rows r0..r0 + rows, columns
            // 32·g..32·g + 32 ≤ n ≤ ldy are inside `sums` (checked above), and no other task
            // writes them. The kernel comes from a table handed out by `table`/`table_for`
            // after detection.
            unsafe {
                args.out = args.out.add(r0 * ldy + GROUP * g);
                kernel(&args, rows);
            }
            return;
        }
        // Through a buffer of whole rows: the last, partial group, or for the sink. (Not
        // zeroed: the tile writes all 32 sums of each of its rows, and only those are read.)
        let mut buf = std::mem::MaybeUninit::<[i32; MAX_MR * GROUP]>::uninit();
        args.out = buf.as_mut_ptr() as *mut i32;
        args.ldo = GROUP;
        // SAFETY: as above, with `buf` (MAX_MR ≥ rows rows of 32) as the output.
        unsafe { kernel(&args, rows) };
        // SAFETY: rows 0..rows of `buf` were written whole by the tile.
        let tile = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const i32, GROUP * rows) };
        match sink {
            Some(f) => f(r0, GROUP * g, tile, cols),
            None => {
                for (r, src) in tile.chunks_exact(GROUP).enumerate() {
                    // SAFETY: row r0 + r < m, columns 32·g..32·g + cols ≤ n ≤ ldy: inside
                    // `sums` (checked above); no other task writes this (row, columns) tile.
                    unsafe {
                        let dst = sums.get().add((r0 + r) * ldy + GROUP * g);
                        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, cols);
                    }
                }
            }
        }
    };
    let tiles = m.div_ceil(mr);
    if groups >= 2 * nthreads || tiles == 1 {
        // Split the weight groups; each worker walks the activation rows in L2-sized blocks.
        let mc = ((ACT_BLOCK_BYTES / kp).max(mr) / mr * mr).min(tiles * mr);
        threads::for_each_range(groups, 1, 1, nthreads, |g0, g1| {
            for m0 in (0..m).step_by(mc) {
                let m1 = (m0 + mc).min(m);
                for g in g0..g1 {
                    for r0 in (m0..m1).step_by(mr) {
                        run_tile(g, r0, mr.min(m1 - r0));
                    }
                }
            }
        });
    } else {
        // Few groups, several activation tiles: split the (tile, group) grid, tile-major.
        threads::for_each_range(tiles * groups, 1, 1, nthreads, |i0, i1| {
            for i in i0..i1 {
                let (t, g) = (i / groups, i % groups);
                run_tile(g, t * mr, mr.min(m - t * mr));
            }
        });
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// xorshift32 stream.
    pub(in crate::backend::cpu) struct Rng(pub(in crate::backend::cpu) u32);
    impl Rng {
        pub(in crate::backend::cpu) fn next(&mut self) -> u32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 17;
            self.0 ^= self.0 << 5;
            self.0
        }
        fn ternary(&mut self, n: usize) -> Vec<i8> {
            (0..n).map(|_| (self.next() % 3) as i8 - 1).collect()
        }
        fn acts(&mut self, n: usize) -> Vec<i8> {
            (0..n).map(|_| self.next() as u8 as i8).collect()
        }
    }

    /// The definition: `Σ_c x[r·k + c] · w[o·k + c]`, in i64.
    pub(in crate::backend::cpu) fn reference(
        w: &[i8],
        n: usize,
        k: usize,
        x: &[i8],
        m: usize,
    ) -> Vec<i64> {
        let mut out = vec![0i64; m * n];
        for r in 0..m {
            for o in 0..n {
                out[r * n + o] = (0..k)
                    .map(|c| x[r * k + c] as i64 * w[o * k + c] as i64)
                    .sum();
            }
        }
        out
    }

    /// Runs `run(isa, sums, ldy)` for every available table (the portable one among them),
    /// checks the written elements of `m` rows of `n` against `want` and that the gaps between
    /// rows are untouched.
    pub(in crate::backend::cpu) fn check_tables(
        want: &[i64],
        n: usize,
        m: usize,
        ldy: usize,
        run: impl Fn(Isa, &mut [i32], usize),
    ) {
        let isas: Vec<Isa> = Isa::ALL
            .into_iter()
            .filter(|&i| table_for(i).is_some())
            .collect();
        assert!(isas.contains(&Isa::Scalar));
        for isa in isas {
            let mut sums = vec![i32::MIN; (m - 1) * ldy + n + 3];
            run(isa, &mut sums, ldy);
            for r in 0..m {
                for o in 0..ldy {
                    let i = r * ldy + o;
                    if o < n {
                        assert_eq!(
                            sums[i] as i64,
                            want[r * n + o],
                            "{isa} n {n} m {m} ldy {ldy}: row {r} col {o}"
                        );
                    } else if i < sums.len() {
                        assert_eq!(sums[i], i32::MIN, "{isa}: wrote outside the output");
                    }
                }
            }
        }
    }

    /// [`check_tables`] for a ternary matrix of `w` and the activations `x`.
    fn check(w: &[i8], n: usize, k: usize, x: &[i8], m: usize, ldy: usize) {
        let t = TernaryMatrix::from_values(n, k, w).expect("valid matrix");
        let want = reference(w, n, k, x, m);
        check_tables(&want, n, m, ldy, |isa, sums, ldy| {
            t.matmul_i8_with(isa, x, m, sums, ldy).expect("supported")
        });
    }

    #[test]
    fn every_isa_matches_the_definition_on_awkward_sizes() {
        let mut rng = Rng(0x9E37_79B9);
        for &k in &[1, 3, 31, 64, 100, 257, 1000, 2561] {
            for &n in &[1, 5, 16, 17, 33] {
                for &m in &[1, 2, 5, 7] {
                    let w = rng.ternary(n * k);
                    let x = rng.acts(m * k);
                    check(&w, n, k, &x, m, n);
                    check(&w, n, k, &x, m, n + 3);
                }
            }
        }
    }

    #[test]
    fn threaded_splits_match_the_definition() {
        let mut rng = Rng(12345);
        // Many groups, one tile (split over groups); few groups, many rows (the tile grid);
        // many groups and rows in several L2 blocks.
        for &(n, k, m) in &[
            (600, 1000, 1),
            (40, 2000, 30),
            (70, 1000, 13),
            (200, 4096, 140),
        ] {
            let w = rng.ternary(n * k);
            let x = rng.acts(m * k);
            check(&w, n, k, &x, m, n + 1);
        }
    }

    #[test]
    fn extreme_activations_do_not_overflow_or_saturate() {
        let (n, k) = (17, 6912);
        // Rows: all +1, all -1, all 0, alternating, then random.
        let mut rng = Rng(7);
        let mut w = Vec::with_capacity(n * k);
        w.extend(std::iter::repeat_n(1i8, k));
        w.extend(std::iter::repeat_n(-1i8, k));
        w.extend(std::iter::repeat_n(0i8, k));
        w.extend((0..k).map(|c| if c.is_multiple_of(2) { 1 } else { -1 }));
        w.extend(rng.ternary((n - 4) * k));
        let mut x = vec![-128i8; k];
        x.extend(std::iter::repeat_n(127i8, k));
        x.extend((0..k).map(|c| if c.is_multiple_of(2) { -128 } else { 127 }));
        check(&w, n, k, &x, 3, n);
        let t = TernaryMatrix::from_values(n, k, &w).expect("valid");
        let mut sums = vec![0i32; 3 * n];
        t.matmul_i8(&x, 3, &mut sums, n);
        assert_eq!(sums[0], -128 * k as i32);
        assert_eq!(sums[1], 128 * k as i32);
        assert_eq!(sums[n + 1], -127 * k as i32);
        assert_eq!(sums[2 * n + 3], -255 * (k as i32 / 2));
    }

    #[test]
    fn from_values_rejects_bad_input() {
        for (n, k, len) in [
            (2, 3, 5),
            (2, 3, 7),
            (0, 3, 0),
            (3, 0, 0),
            (usize::MAX, 2, 4),
        ] {
            let r = TernaryMatrix::from_values(n, k, &vec![0; len]);
            assert!(
                matches!(r, Err(Error::Shape { .. })),
                "{n} × {k}, {len} values"
            );
        }
        for bad in [2i8, -2, 127, -128] {
            let mut v = vec![0i8; 6];
            v[4] = bad;
            let e = TernaryMatrix::from_values(2, 3, &v).expect_err("value out of range");
            assert!(matches!(e, Error::InvalidInput(_)), "{e}");
            assert!(e.to_string().contains("row 1, column 1"), "{e}");
        }
    }

    #[test]
    fn row_values_round_trip_and_sizes() {
        let mut rng = Rng(99);
        for &(n, k) in &[(1, 1), (5, 3), (17, 31), (33, 257), (16, 64)] {
            let w = rng.ternary(n * k);
            let t = TernaryMatrix::from_values(n, k, &w).expect("valid");
            assert_eq!((t.n_rows(), t.k()), (n, k));
            assert_eq!(
                t.packed_bytes(),
                n.div_ceil(32) * 32 * k.div_ceil(16) * 16 / 4
            );
            let mut row = vec![9i8; k];
            for r in 0..n {
                t.row_values(r, &mut row);
                assert_eq!(row, w[r * k..(r + 1) * k], "row {r} of {n} × {k}");
            }
        }
    }

    #[test]
    fn quantize_rounds_half_to_even() {
        // max |x| = 127: scale exactly 1, products exact.
        let x = [
            127.0, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.5, 0.49, -126.5, 125.5,
        ];
        let mut q = [0i8; 11];
        assert_eq!(quantize_row_absmax(&x, &mut q), 1.0);
        assert_eq!(q, [127, 2, 4, -2, -4, 0, 0, 2, 0, -126, 126]);
        // max |x| = 63.5: scale 2, 1.25 · 2 = 2.5 → 2, 1.75 · 2 = 3.5 → 4.
        let x = [-63.5, 1.25, 1.75, -1.25, 0.25, 10.0];
        let mut q = [0i8; 6];
        assert_eq!(quantize_row_absmax(&x, &mut q), 2.0);
        assert_eq!(q, [-127, 2, 4, -2, 0, 20]);
    }

    #[test]
    fn quantize_zero_rows_and_clamping() {
        let mut q = [5i8; 4];
        let s = quantize_row_absmax(&[0.0, -0.0, 0.0, 0.0], &mut q);
        // torch: 127 / clamp(0, min=1e-5) = 12700000.0 (bits 0x4b41c960).
        assert_eq!(s.to_bits(), 0x4b41_c960);
        assert_eq!(q, [0; 4]);
        // Below the 1e-5 floor the scale stays 127 / 1e-5.
        let s = quantize_row_absmax(&[1e-6, -2e-6, 0.0, 5e-7], &mut q);
        assert_eq!(s.to_bits(), 0x4b41_c960);
        let want = [1e-6f32, -2e-6, 0.0, 5e-7].map(|v| (v * s).round_ties_even() as i8);
        assert_eq!(q, want);
        // The clamp and rounding of the quantizer itself.
        let v = [200.0, 127.5, 126.5, -128.4, -128.5, -1e30, f32::INFINITY];
        assert_eq!(v.map(round_clamp), [127, 127, 126, -128, -128, -128, 127]);
        let v = [f32::NAN, -0.5, -1.5, 0.5, 1.5];
        assert_eq!(v.map(round_clamp), [0, 0, -2, 0, 2]);
        // The integer form agrees on every finite value (all halves in range, the clamps).
        for i in -600..=600 {
            let v = i as f32 * 0.25;
            assert_eq!(round_clamp_finite(v), round_clamp(v), "{v}");
        }
        for v in [
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            127.49,
            -128.49,
            1e-40,
            -0.0,
        ] {
            assert_eq!(round_clamp_finite(v), round_clamp(v), "{v}");
        }
        // A NaN with a payload still gives zeros; infinities give the clamped zeros/NaNs.
        let s = quantize_row_absmax(&[1.0, f32::from_bits(0x7FC0_0123), 3.0, -2.0], &mut q);
        assert!(s.is_nan());
        assert_eq!(q, [0; 4]);
        let s = quantize_row_absmax(&[1.0, f32::INFINITY, -3.0, 0.0], &mut q);
        assert_eq!((s, q), (0.0, [0; 4]));
        // A NaN in the row: NaN scale, zeros.
        let s = quantize_row_absmax(&[1.0, f32::NAN, 3.0, -2.0], &mut q);
        assert!(s.is_nan());
        assert_eq!(q, [0; 4]);
    }

    /// Values from torch 2.15 (`127 / x.abs().max(-1, keepdim=True).values.clamp(min=1e-5)`,
    /// `(x * scale).round().clamp(-128, 127)`): the scale is `reciprocal() * 127`, one ulp
    /// above the f32 quotient for max 3 and 5.9, which moves these half-way cases.
    #[test]
    fn quantize_matches_torch_where_its_scale_is_not_the_quotient() {
        let mut q = [0i8; 3];
        let x = [0x4040_0000, 0xC03F_3E7D, 0xC03D_BB76].map(f32::from_bits); // 3.0, -2.98..
        let s = quantize_row_absmax(&x, &mut q);
        assert_eq!(s.to_bits(), 0x4229_5556);
        assert_ne!(s, 127.0f32 / 3.0);
        assert_eq!(q, [127, -127, -126]);
        let s = quantize_row_absmax(&[5.9, -1.0, 0.0], &mut q);
        assert_eq!(s.to_bits(), 0x41ac_3412);
        let bits = [0.7f32, 1.1, 10.1].map(|v| quantize_row_absmax(&[v, 0.0, 0.0], &mut q));
        assert_eq!(
            bits.map(f32::to_bits),
            [0x4335_6db7, 0x42e6_e8ba, 0x4149_3028]
        );
    }

    /// The dispatched loops (AVX-512 where the CPU has it) against the portable ones.
    #[test]
    fn quantizer_loops_agree_with_the_portable_ones() {
        let mut rng = Rng(2718);
        for &k in &[1, 15, 16, 17, 100, 384, 1000, 1537] {
            for scale_exp in [-30, -3, 0, 4, 20] {
                let x: Vec<f32> = (0..k)
                    .map(|_| {
                        let u = rng.next() as f32 / u32::MAX as f32 - 0.5;
                        u * 2f32.powi(scale_exp)
                    })
                    .collect();
                let (mut a, mut b) = (vec![0i8; k], vec![0i8; k]);
                let sa = quantize_row_absmax(&x, &mut a);
                // SAFETY: the portable loops run anywhere.
                let sb = unsafe { quantize_row_absmax_in(&x, &mut b, PORTABLE_QUANTIZER) };
                assert_eq!(
                    (sa.to_bits(), &a),
                    (sb.to_bits(), &b),
                    "k {k} 2^{scale_exp}"
                );
            }
        }
    }

    #[test]
    fn quantize_matches_the_torch_formula() {
        let mut rng = Rng(4242);
        for &k in &[1, 7, 64, 1000, 2561] {
            let m = 5;
            let mut x: Vec<f32> = (0..m * k)
                .map(|_| (rng.next() as f32 / u32::MAX as f32 - 0.5) * 6.0)
                .collect();
            // Some exact ties: max |x| = 127 · 2^-3 in row 0 gives scale 8.
            x[0] = 127.0 / 8.0;
            for (i, v) in x[1..k].iter_mut().enumerate().step_by(3) {
                *v = ((i % 50) as f32 - 25.0 + 0.5) / 8.0;
            }
            let mut q = vec![0i8; m * k];
            let scales = quantize_rows_absmax(&x, m, k, &mut q);
            for r in 0..m {
                let row = &x[r * k..(r + 1) * k];
                let amax = row.iter().fold(0f32, |a, v| a.max(v.abs()));
                let s = amax.max(1e-5).recip() * 127.0;
                assert_eq!(scales[r], s);
                for (c, v) in row.iter().enumerate() {
                    let want = (v * s).round_ties_even().clamp(-128.0, 127.0) as i8;
                    assert_eq!(q[r * k + c], want, "row {r} col {c}: {v} · {s}");
                }
            }
        }
    }
}
