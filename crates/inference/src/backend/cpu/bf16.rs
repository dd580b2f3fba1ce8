//! bf16 matrix products for prefill: weights packed once as bf16 pairs, activations rounded to
//! bf16 per call, products accumulated in f32 with the semantics of `vdpbf16ps`.
//!
//! This module owns the bf16 rounding, the packed weight layout ([`Bf16Weights`]), the blocked
//! and threaded driver ([`gemm_bt_bf16`]), the scalar reference ([`gemm_bt_bf16_reference`])
//! and the portable microkernel used when the CPU lacks AVX512_BF16. The AVX512_BF16
//! microkernel and the vectorized activation conversion live in `x86/gemm_bf16.rs`.
//!
//! # Arithmetic (what every path computes, bit for bit)
//!
//! Inputs are rounded to bf16 as `vcvtne2ps2bf16` does: round to nearest even, subnormal inputs
//! to signed zero (DAZ), NaN quieted ([`round_to_bf16`]). Weights given as bf16 bits keep their
//! value, except subnormals, which become signed zero (`vdpbf16ps` treats them as zero).
//!
//! Each output starts from `y` (with `accumulate`; subnormal → zero) or `+0.0` and then takes,
//! for every depth pair `(2p, 2p+1)` in increasing `p` (odd `k` padded with a zero pair):
//!
//! ```text
//! acc = ftz(acc + x[2p+1]·w[2p+1])
//! acc = ftz(acc + x[2p]  ·w[2p])
//! ```
//!
//! where each product of two bf16 values is exact in f32, each addition rounds to nearest even
//! and `ftz` flushes a subnormal result to signed zero. This is the Intel SDM operation of
//! `VDPBF16PS` (high element of the pair first, "RNE for each accumulation", output denormals
//! flushed, input denormals treated as zero), and was checked against the instruction on the
//! Zen 4 dev VM: 3.2 M random lanes bit-identical with this order, 9 % different with the
//! low element first and 5 % with a single rounding of the pair sum; the flush of the
//! intermediate sum and the DAZ of the accumulator were checked by hand-built cases.
//!
//! The one case where the reference can differ from the instruction: a product whose exact
//! value is below 2^-126 in magnitude. The instruction adds the exact product; the reference
//! first rounds it to an f32 subnormal (error at most 2^-150). Products of activations and
//! weights of real models are many orders of magnitude above that.
//!
//! Because the microkernels start every tile from `y` and continue the same chain over all
//! depth blocks, the result does not depend on the block sizes, the split over threads or
//! the instruction set: the AVX512_BF16 path, the portable path and the reference agree
//! exactly (the tests assert equality).
//!
//! # AMX
//!
//! On CPUs with AMX-BF16 (and the OS's permission, `x86/amx.rs`) products of at least
//! [`AMX_MIN_ROWS`] rows run on the tile unit, 3.5x the `vdpbf16ps` kernel's rate on one
//! core. `tdpbf16ps` does not follow the chain above: measured on the instruction, it matches
//! each of the obvious per-pair orders in only ~43 % of outputs and keeps a subnormal
//! intermediate sum that the chain flushes, so its internal accumulation is its own. Its
//! results are checked against the exact (f64) dot product of the same bf16 inputs instead,
//! within the f32 rounding bound `(k + 2) · ε · Σ|products|`; like the vector kernels they do
//! not depend on the blocking or the threads, but a `--bf16` product of two rows or more on an
//! AMX machine can differ in its last bits from the same row computed alone.

use std::cell::RefCell;

use super::threads;
use crate::error::{Error, Result};

/// Columns of one packed weight panel (two zmm registers of 16 f32 lanes).
pub(crate) const NR: usize = 32;
/// Rows of the register tile (24 accumulators + 2 panel vectors + 1 broadcast of 32 zmm).
pub(crate) const MR: usize = 12;
/// Depth pairs per call of the vector microkernels: an A sliver of `MR × KCP` pairs (12 KiB)
/// stays in L1.
pub(crate) const KCP: usize = 256;
/// Columns swept per A sliver: the `KCP × NC` part of their panels (256 KiB) stays in L2.
const NC: usize = 256;

/// Microkernel: `(kcp, a, lda, b, next_b, c, ldc, mr, nr, load_c)`.
///
/// `y[i][j] = chain(load_c ? y[i][j] : 0, a row i, panel column j)` for `i < mr`, `j < nr`
/// (see the module doc); `a` row `i` is `kcp` pairs at `a + i·lda`, `b` a panel of `kcp`
/// groups of [`NR`] pairs. `next_b` is where the driver's next call reads its panel (a
/// prefetch hint, never dereferenced; null when there is none).
///
/// # Safety
/// `a[i·lda .. i·lda + kcp]` for `i < mr` and `b[.. kcp·NR]` readable, `c[i·ldc .. i·ldc + nr]`
/// for `i < mr` readable and writable, `mr <= MR`, `nr <= NR`, and the CPU must support the
/// kernel's instruction set.
pub(crate) type Ukr = unsafe fn(
    usize,
    *const u32,
    usize,
    *const u32,
    *const u32,
    *mut f32,
    usize,
    usize,
    usize,
    bool,
);

/// Activation conversion: `(src, ld, rows, k, kp0, kcp, dst)` writes, for each of `rows` rows of
/// `src` (`ld` apart), the pairs `kp0 .. kp0 + kcp` of the row rounded to bf16 into
/// `dst[r·kcp ..]` (depth `k` and beyond reads as zero).
pub(crate) type CvtRows = unsafe fn(&[f32], usize, usize, usize, usize, usize, &mut [u32]);

/// Rounds an f32 to bf16 bits as `vcvtne2ps2bf16` does: round to nearest even, subnormal
/// inputs to signed zero, NaN kept (quieted), overflow to infinity.
#[inline]
pub fn round_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7f80_0000 == 0 {
        return ((b >> 16) & 0x8000) as u16;
    }
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16
}

/// The bf16 bits of `x` when `x` is exactly a bf16 value (its low 16 bits zero), else `None`.
#[inline]
pub fn exact_bf16(x: f32) -> Option<u16> {
    let b = x.to_bits();
    (b & 0xffff == 0).then_some((b >> 16) as u16)
}

/// The f32 value of bf16 bits (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// bf16 bits with a subnormal replaced by signed zero (as `vdpbf16ps` reads its inputs).
#[inline]
fn daz_bf16(b: u16) -> u16 {
    if b & 0x7f80 == 0 {
        b & 0x8000
    } else {
        b
    }
}

/// A subnormal f32 replaced by signed zero.
#[inline(always)]
fn ftz(v: f32) -> f32 {
    let b = v.to_bits();
    if b & 0x7f80_0000 == 0 {
        f32::from_bits(b & 0x8000_0000)
    } else {
        v
    }
}

/// One pair as `vdpbf16ps` reads it: the even depth in the low half, the odd one in the high.
#[inline(always)]
fn pair(lo: u16, hi: u16) -> u32 {
    u32::from(lo) | (u32::from(hi) << 16)
}

/// The f32 values (high, low) of a packed pair.
#[inline(always)]
fn unpair(v: u32) -> (f32, f32) {
    (f32::from_bits(v & 0xffff_0000), f32::from_bits(v << 16))
}

/// Whether this CPU runs the AVX512_BF16 microkernel (`vdpbf16ps`); otherwise
/// [`gemm_bt_bf16`] uses the portable kernel, which gives the same results, slower.
pub fn native_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bf16")
            && std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A weight matrix `w[n×k]` (the `nn.Linear` layout) stored as bf16 and packed once for
/// [`gemm_bt_bf16`]; half the memory of the f32 original.
///
/// Layout (one `u32` = one bf16 pair, depth `2p` in the low half, `2p+1` in the high half, as
/// `vdpbf16ps` reads them, and as AMX-BF16 reads a B tile): `n.div_ceil(32)` panels, panel `t`
/// at `u32` `t · kp · 32` holding `kp = k.div_ceil(2)` groups of 32 pairs (group `p` holds
/// pair `p` of rows `32t .. 32t + 32`), so any depth range of a panel is contiguous. Rows past
/// `n` and the depth past an odd `k` are zero.
#[derive(Clone)]
pub struct Bf16Weights {
    n: usize,
    k: usize,
    /// Offset of the first pair in `buf`, chosen for 64-byte alignment.
    offset: usize,
    buf: Vec<u32>,
}

impl std::fmt::Debug for Bf16Weights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bf16Weights")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl Bf16Weights {
    /// Packs `w[n×k]` given as bf16 bits (row-major, `n·k` values, as stored in safetensors
    /// or GGUF). Subnormal values become signed zero. Errors if `w.len() != n·k`.
    pub fn from_bf16(n: usize, k: usize, w: &[u16]) -> Result<Self> {
        check_len("Bf16Weights::from_bf16", n, k, w.len())?;
        Ok(Self::pack(n, k, |j, q| daz_bf16(w[j * k + q])))
    }

    /// Packs `w[n×k]` given as f32 (row-major, `n·k` values), rounded to bf16 by
    /// [`round_to_bf16`]. Errors if `w.len() != n·k`.
    pub fn from_f32(n: usize, k: usize, w: &[f32]) -> Result<Self> {
        check_len("Bf16Weights::from_f32", n, k, w.len())?;
        Ok(Self::pack(n, k, |j, q| round_to_bf16(w[j * k + q])))
    }

    /// Output features (rows of the original matrix).
    pub fn n(&self) -> usize {
        self.n
    }

    /// Input features (columns of the original matrix).
    pub fn k(&self) -> usize {
        self.k
    }

    /// The bf16 bits of `w[j][q]` as packed (subnormals already flushed). Panics if out of range.
    pub fn get(&self, j: usize, q: usize) -> u16 {
        assert!(j < self.n && q < self.k, "Bf16Weights::get out of range");
        let (p, hi) = (q / 2, q % 2 == 1);
        let idx = (j / NR) * self.k.div_ceil(2) * NR + p * NR + j % NR;
        let v = self.data()[idx];
        if hi {
            (v >> 16) as u16
        } else {
            v as u16
        }
    }

    /// The packed pairs (`n` rounded up to [`NR`], times `k.div_ceil(2)`).
    fn data(&self) -> &[u32] {
        &self.buf[self.offset..]
    }

    /// Packs from an element accessor `at(j, q)` returning bf16 bits.
    fn pack(n: usize, k: usize, at: impl Fn(usize, usize) -> u16) -> Self {
        let kp = k.div_ceil(2);
        let n_pad = n.next_multiple_of(NR);
        let len = n_pad * kp;
        let mut buf = vec![0u32; len + 16];
        let misalign = (buf.as_ptr() as usize / std::mem::size_of::<u32>()) % 16;
        let offset = (16 - misalign) % 16;
        let data = &mut buf[offset..offset + len];
        for j in 0..n {
            let panel = &mut data[(j / NR) * kp * NR..];
            for p in 0..kp {
                let q = 2 * p;
                let hi = if q + 1 < k { at(j, q + 1) } else { 0 };
                panel[p * NR + j % NR] = pair(at(j, q), hi);
            }
        }
        Bf16Weights { n, k, offset, buf }
    }
}

fn check_len(op: &'static str, n: usize, k: usize, len: usize) -> Result<()> {
    match n.checked_mul(k) {
        Some(nk) if nk == len => Ok(()),
        _ => Err(Error::Shape {
            op,
            reason: format!("weights hold {len} values, expected n·k = {n}·{k}"),
        }),
    }
}

/// Checks the shapes of a product `y[m×n] (+)= x[m×k]·wᵀ`.
fn check_gemm(
    op: &'static str,
    (m, n, k): (usize, usize, usize),
    w_shape: (usize, usize),
    x_len: usize,
    y_len: usize,
    ldy: usize,
) -> Result<()> {
    let err = |reason: String| Err(Error::Shape { op, reason });
    if w_shape != (n, k) {
        return err(format!(
            "weights are {}×{}, the product needs n×k = {n}×{k}",
            w_shape.0, w_shape.1
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m.checked_mul(k).is_none_or(|mk| x_len < mk) {
        return err(format!("x holds {x_len} values, needs m·k = {m}·{k}"));
    }
    if m > 1 && ldy < n {
        return err(format!("ldy {ldy} < n {n}"));
    }
    let need = (m - 1).checked_mul(ldy).and_then(|v| v.checked_add(n));
    if need.is_none_or(|need| y_len < need) {
        return err(format!(
            "y holds {y_len} values, needs (m-1)·ldy + n for m {m}, ldy {ldy}, n {n}"
        ));
    }
    Ok(())
}

/// `y[m×n] (+)= x[m×k] · wᵀ` in bf16 with f32 accumulation (see the module doc for the exact
/// arithmetic): `x` is f32, row-major, `m·k` values (rounded to bf16 here), `y` rows are `ldy`
/// apart; with `accumulate` the product is added to `y`, otherwise `y` is overwritten.
///
/// Uses `vdpbf16ps` where the CPU has AVX512_BF16 ([`native_supported`]), the portable kernel
/// otherwise (same results). Large products are split over the rayon worker threads. Then
/// `y = act(y + bias)` on each block of outputs while it is in cache: the bias (`[n]`) if
/// given, then GELU if asked, computed as [`super::gelu_rational`] (within `2.5e-7 · |x|` of
/// the exact GELU; the bf16 activations already change numbers far more). Errors if `w` is not
/// `n×k`, the bias not `n` long or a slice is too short for its shape.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt_bf16(
    m: usize,
    n: usize,
    k: usize,
    x: &[f32],
    w: &Bf16Weights,
    y: &mut [f32],
    ldy: usize,
    accumulate: bool,
    bias: Option<&[f32]>,
    gelu: bool,
) -> Result<()> {
    if bias.is_some_and(|b| b.len() != n) {
        return Err(Error::InvalidInput(format!(
            "gemm_bt_bf16: bias of {} for {n} outputs",
            bias.map_or(0, <[f32]>::len)
        )));
    }
    gemm_with(
        kernel_for(m),
        m,
        n,
        k,
        x,
        w,
        y,
        ldy,
        accumulate,
        Finish { bias, gelu },
    )
}

/// What [`gemm_bt_bf16`] does to the outputs after the product.
#[derive(Clone, Copy, Default)]
pub(crate) struct Finish<'a> {
    /// Added to every output row (`[n]`).
    bias: Option<&'a [f32]>,
    /// The rational GELU last.
    gelu: bool,
}

impl Finish<'_> {
    /// Applies the finish to columns `j0..j0 + row.len()` of one output row.
    fn apply(&self, row: &mut [f32], j0: usize) {
        if let Some(b) = self.bias {
            super::add_bias(row, &b[j0..j0 + row.len()]);
        }
        if self.gelu {
            super::gelu_rational(row);
        }
    }

    fn is_noop(&self) -> bool {
        self.bias.is_none() && !self.gelu
    }
}

/// Fewest rows a product needs to run on AMX tiles. A one-row product (a decode step) streams
/// its weights slightly faster through `vdpbf16ps` (Qwen3.5-0.8B shape on a Xeon: 15.0-15.2
/// against 14.0-14.6 tokens/s on AMX); from two rows the tiles win although they compute
/// padded rows (two streams 19.0 -> 25.2-25.8 tokens/s, four 29.8 -> 41.2-41.9; one
/// all-MiniLM-L6-v2 sentence 2.7 -> 1.4 ms).
pub(crate) const AMX_MIN_ROWS: usize = 2;

/// The kernel for a product of `m` rows: [`kernel`], except that AMX is used from
/// [`AMX_MIN_ROWS`] rows on.
pub(crate) fn kernel_for(m: usize) -> Kernel {
    if m < AMX_MIN_ROWS {
        vector_kernel()
    } else {
        kernel()
    }
}

/// The scalar reference of [`gemm_bt_bf16`] on unpacked operands: `w` is bf16 bits `[n×k]`
/// (row-major), `x` f32 `[m×k]`. One output element at a time, in the order of the module
/// doc; [`gemm_bt_bf16`] returns exactly these values.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bt_bf16_reference(
    m: usize,
    n: usize,
    k: usize,
    x: &[f32],
    w: &[u16],
    y: &mut [f32],
    ldy: usize,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "gemm_bt_bf16_reference";
    check_len(OP, n, k, w.len())?;
    check_gemm(OP, (m, n, k), (n, k), x.len(), y.len(), ldy)?;
    let xv = |i: usize, q: usize| {
        if q < k {
            bf16_to_f32(round_to_bf16(x[i * k + q]))
        } else {
            0.0
        }
    };
    let wv = |j: usize, q: usize| {
        if q < k {
            bf16_to_f32(daz_bf16(w[j * k + q]))
        } else {
            0.0
        }
    };
    for i in 0..m {
        for j in 0..n {
            let out = &mut y[i * ldy + j];
            let mut acc = if accumulate { *out } else { 0.0 };
            if k > 0 {
                // The instruction reads its accumulator with DAZ.
                acc = ftz(acc);
            }
            for p in 0..k.div_ceil(2) {
                acc = ftz(acc + xv(i, 2 * p + 1) * wv(j, 2 * p + 1));
                acc = ftz(acc + xv(i, 2 * p) * wv(j, 2 * p));
            }
            *out = acc;
        }
    }
    Ok(())
}

/// A microkernel, the matching activation conversion and the microkernel's rows.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    pub(crate) ukr: Ukr,
    pub(crate) cvt: CvtRows,
    /// Rows of one microkernel call (the tile height; [`MR`] for the vector kernels).
    pub(crate) mr: usize,
    /// Whether one microkernel call takes the whole depth (the AMX kernel: its outputs leave
    /// the tile registers once, where a round trip per [`KCP`] pairs, through rows `ldy`
    /// apart that share cache sets, bounded it) rather than [`KCP`] pairs (the vector
    /// kernels, except for products of one row tile).
    pub(crate) whole_depth: bool,
    /// What `lattice bench` reports (`"amx-bf16"`, `"avx512bf16"`, `"portable"`).
    pub(crate) name: &'static str,
}

/// The portable kernel (any CPU).
pub(crate) const PORTABLE: Kernel = Kernel {
    ukr: portable_ukr,
    cvt: portable_cvt,
    mr: MR,
    whole_depth: false,
    name: "portable",
};

/// Whether this process multiplies bf16 on AMX tiles (AMX-BF16, with the OS's permission;
/// `LATTICE_AMX=0` turns it off).
pub fn amx_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::x86::amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The bf16 products this CPU runs: `"amx-bf16"` (tiles, from [`AMX_MIN_ROWS`] rows; fewer
/// rows on `vdpbf16ps`), `"avx512bf16"` or `"portable"`.
pub fn kernel_name() -> &'static str {
    kernel().name
}

/// What `--bf16` layers (`Linear::from_bf16`) multiply with on this CPU: [`kernel_name`]'s
/// products where the CPU has bf16 instructions, else `"f32 (bf16-rounded weights)"`.
pub fn linear_products() -> &'static str {
    if native_supported() {
        kernel_name()
    } else {
        "f32 (bf16-rounded weights)"
    }
}

/// The best kernel for this CPU: AMX tiles, else [`vector_kernel`].
pub(crate) fn kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if amx_supported() {
        return super::x86::amx::KERNEL;
    }
    vector_kernel()
}

/// The best kernel without AMX: `vdpbf16ps`, else portable.
fn vector_kernel() -> Kernel {
    #[cfg(target_arch = "x86_64")]
    if native_supported() {
        return super::x86::gemm_bf16::KERNEL;
    }
    PORTABLE
}

/// Base pointer and row stride of `y`, shared by the threads; each writes a disjoint block.
#[derive(Clone, Copy)]
struct YMat {
    ptr: *mut f32,
    ld: usize,
}

// SAFETY: a plain address; `gemm_with` gives every thread a disjoint block of `y` and keeps the
// `&mut [f32]` it came from borrowed until all threads are done.
unsafe impl Send for YMat {}
// SAFETY: as above, no two threads write the same element.
unsafe impl Sync for YMat {}

/// [`gemm_bt_bf16`] with a given kernel (the tests run both).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_with(
    kern: Kernel,
    m: usize,
    n: usize,
    k: usize,
    x: &[f32],
    w: &Bf16Weights,
    y: &mut [f32],
    ldy: usize,
    accumulate: bool,
    finish: Finish<'_>,
) -> Result<()> {
    check_gemm("gemm_bt_bf16", (m, n, k), (w.n, w.k), x.len(), y.len(), ldy)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let ymat = YMat {
        ptr: y.as_mut_ptr(),
        ld: ldy,
    };
    let flops = m.saturating_mul(n).saturating_mul(k).saturating_mul(2);
    let threads = if flops >= threads::PAR_MIN_FLOPS {
        threads::count()
    } else {
        1
    };
    // Rows are split when there are enough of them (each part then converts only its own
    // activations and reads all weights); otherwise columns, in whole panels.
    let mr = kern.mr;
    if m >= 4 * mr * threads {
        threads::for_each_range(m, mr, 8 * mr, threads, |i0, i1| {
            block(kern, x, k, w, ymat, accumulate, finish, i0, i1 - i0, 0, n);
        });
    } else {
        threads::for_each_range(n, NR, 256, threads, |j0, j1| {
            block(kern, x, k, w, ymat, accumulate, finish, 0, m, j0, j1 - j0);
        });
    }
    Ok(())
}

thread_local! {
    /// Per-thread buffer of activations converted to bf16 pairs, reused across calls.
    static ABUF: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Computes `y[i0..i0+mm, j0..j0+nn]` on the calling thread (`j0` a multiple of [`NR`]), the
/// finish applied to each `NC`-column block after its last depth block.
#[allow(clippy::too_many_arguments)]
fn block(
    kern: Kernel,
    x: &[f32],
    k: usize,
    w: &Bf16Weights,
    y: YMat,
    accumulate: bool,
    finish: Finish<'_>,
    i0: usize,
    mm: usize,
    j0: usize,
    nn: usize,
) {
    let kp = k.div_ceil(2);
    if kp == 0 {
        for i in i0..i0 + mm {
            // SAFETY: `gemm_with` checked that row i holds n >= j0 + nn columns; this thread
            // owns the block.
            let row = unsafe { std::slice::from_raw_parts_mut(y.ptr.add(i * y.ld + j0), nn) };
            if !accumulate {
                row.fill(0.0);
            }
            // `vdpbf16ps` never runs, so nothing flushes: an empty product leaves y as it is.
            finish.apply(row, j0);
        }
        return;
    }
    let run = |abuf: &mut Vec<u32>| {
        let wdata = w.data();
        let panel_at = |jr: usize, p0: usize| ((j0 + jr) / NR) * kp * NR + p0 * NR;
        for p0 in (0..kp).step_by(KCP) {
            let kcp = KCP.min(kp - p0);
            // (Grown, never cleared: the conversion writes every pair of the rows it is given.)
            if abuf.len() < mm * kcp {
                abuf.resize(mm * kcp, 0);
            }
            let xs = &x[i0 * k..(i0 + mm) * k];
            // SAFETY: the kernel was selected after detecting its instruction set; slices are
            // bounds-checked inside.
            unsafe { (kern.cvt)(xs, k, mm, k, p0, kcp, &mut abuf[..mm * kcp]) };
            let load_c = accumulate || p0 > 0;
            for jc in (0..nn).step_by(NC) {
                let ncc = NC.min(nn - jc);
                for ir in (0..mm).step_by(kern.mr) {
                    let mr = kern.mr.min(mm - ir);
                    for jr in (jc..jc + ncc).step_by(NR) {
                        let nr = NR.min(nn - jr);
                        let panel = &wdata[panel_at(jr, p0)..][..kcp * NR];
                        // SAFETY: the A rows ir..ir+mr of `abuf` hold kcp pairs each, the panel
                        // kcp·NR pairs (both slices above); rows i0+ir.. (mr of them) and
                        // columns j0+jr.. (nr of them) of y are in bounds (checked by
                        // `gemm_with`) and owned by this thread; the kernel matches the CPU.
                        unsafe {
                            (kern.ukr)(
                                kcp,
                                abuf.as_ptr().add(ir * kcp),
                                kcp,
                                panel.as_ptr(),
                                std::ptr::null(),
                                y.ptr.add((i0 + ir) * y.ld + j0 + jr),
                                y.ld,
                                mr,
                                nr,
                                load_c,
                            )
                        };
                    }
                }
                if p0 + kcp == kp && !finish.is_noop() {
                    finish_rows(y, finish, i0..i0 + mm, j0 + jc, ncc);
                }
            }
        }
    };
    let run_whole_depth = |abuf: &mut Vec<u32>| {
        let wdata = w.data();
        let panel_at = |jr: usize| ((j0 + jr) / NR) * kp * NR;
        // Rows of converted activations `lda` pairs apart: an odd number of cache lines, so
        // that the 16 rows of an A tile fall into 16 different L1 sets.
        let lda = (kp.div_ceil(16) | 1) * 16;
        if abuf.len() < mm * lda {
            abuf.resize(mm * lda, 0);
        }
        for r in 0..mm {
            let row = &x[(i0 + r) * k..(i0 + r + 1) * k];
            // SAFETY: as in `run`.
            unsafe { (kern.cvt)(row, k, 1, k, 0, kp, &mut abuf[r * lda..r * lda + kp]) };
        }
        // Columns per block: their panels (kp·nc pairs) stay in L2 (1 MiB) while every row
        // tile passes over them.
        let nc = ((256 * 1024) / kp).clamp(NR, 16 * NR) / NR * NR;
        for jc in (0..nn).step_by(nc) {
            let ncc = nc.min(nn - jc);
            for ir in (0..mm).step_by(kern.mr) {
                let mr = kern.mr.min(mm - ir);
                for jr in (jc..jc + ncc).step_by(NR) {
                    let nr = NR.min(nn - jr);
                    let panel = &wdata[panel_at(jr)..][..kp * NR];
                    // The next call's panel: the next column tile's, else the block's first.
                    let next = if jr + NR < jc + ncc { jr + NR } else { jc };
                    let next_b = wdata.as_ptr().wrapping_add(panel_at(next));
                    // SAFETY: rows ir..ir+mr of `abuf` hold kp pairs each (`lda` apart), the
                    // panel kp·NR pairs (slices above); rows i0+ir.. (mr of them) and columns
                    // j0+jr.. (nr of them) of y are in bounds (checked by `gemm_with`) and
                    // owned by this thread; the kernel matches the CPU; `next_b` is a hint.
                    unsafe {
                        (kern.ukr)(
                            kp,
                            abuf.as_ptr().add(ir * lda),
                            lda,
                            panel.as_ptr(),
                            next_b,
                            y.ptr.add((i0 + ir) * y.ld + j0 + jr),
                            y.ld,
                            mr,
                            nr,
                            accumulate,
                        )
                    };
                }
                if !finish.is_noop() {
                    finish_rows(y, finish, i0 + ir..i0 + ir + mr, j0 + jc, ncc);
                }
            }
        }
    };
    // One row tile (decode steps) also takes the whole depth per call: its panels then stream
    // in order, and the sums stay in registers.
    let whole_depth = kern.whole_depth || mm <= kern.mr;
    ABUF.with(|cell| match (cell.try_borrow_mut(), whole_depth) {
        (Ok(mut buf), false) => run(&mut buf),
        (Ok(mut buf), true) => run_whole_depth(&mut buf),
        (Err(_), false) => run(&mut Vec::new()),
        (Err(_), true) => run_whole_depth(&mut Vec::new()),
    });
}

/// Applies `finish` to columns `j0 .. j0 + nc` of output rows `rows`.
fn finish_rows(y: YMat, finish: Finish<'_>, rows: std::ops::Range<usize>, j0: usize, nc: usize) {
    for i in rows {
        // SAFETY: the caller's block owns rows `rows` and columns j0..j0 + nc of y (in bounds,
        // checked by `gemm_with`), and no kernel call is live.
        let row = unsafe { std::slice::from_raw_parts_mut(y.ptr.add(i * y.ld + j0), nc) };
        finish.apply(row, j0);
    }
}

/// Portable activation conversion (see [`CvtRows`]).
///
/// # Safety
/// None beyond the signature (safe code; `unsafe` only to share the function type).
unsafe fn portable_cvt(
    src: &[f32],
    ld: usize,
    rows: usize,
    k: usize,
    kp0: usize,
    kcp: usize,
    dst: &mut [u32],
) {
    cvt_rows(src, ld, rows, k, kp0, kcp, dst)
}

/// Converts pairs `kp0 .. kp0 + kcp` of `rows` rows of `src` to bf16 pairs in `dst` (see
/// [`CvtRows`]); shared by the portable kernel and the edges of the AVX-512 one.
pub(crate) fn cvt_rows(
    src: &[f32],
    ld: usize,
    rows: usize,
    k: usize,
    kp0: usize,
    kcp: usize,
    dst: &mut [u32],
) {
    for r in 0..rows {
        let row = &src[r * ld..r * ld + k];
        let out = &mut dst[r * kcp..(r + 1) * kcp];
        for (p, o) in out.iter_mut().enumerate() {
            let q = 2 * (kp0 + p);
            let lo = row.get(q).map_or(0, |&v| round_to_bf16(v));
            let hi = row.get(q + 1).map_or(0, |&v| round_to_bf16(v));
            *o = pair(lo, hi);
        }
    }
}

/// Portable microkernel (see [`Ukr`]): the module's chain on `MR × NR` accumulators, written
/// so that the compiler vectorizes the column loop (no fused multiply-add: Rust never
/// contracts, so each product and sum is rounded exactly as specified).
///
/// # Safety
/// The [`Ukr`] contract.
#[allow(clippy::too_many_arguments)]
unsafe fn portable_ukr(
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
    let mut acc = [[0.0f32; NR]; MR];
    for (i, row) in acc.iter_mut().enumerate().take(mr) {
        if load_c {
            // SAFETY: row i < mr of C holds nr readable columns (contract).
            let cr = unsafe { std::slice::from_raw_parts(c.add(i * ldc), nr) };
            for (r, &v) in row.iter_mut().zip(cr) {
                *r = ftz(v);
            }
        }
    }
    // SAFETY: the panel holds kcp·NR pairs (contract).
    let panel = unsafe { std::slice::from_raw_parts(b, kcp * NR) };
    for (p, bp) in panel.chunks_exact(NR).enumerate() {
        let mut bhi = [0.0f32; NR];
        let mut blo = [0.0f32; NR];
        for ((h, l), &v) in bhi.iter_mut().zip(blo.iter_mut()).zip(bp) {
            (*h, *l) = unpair(v);
        }
        for (i, row) in acc.iter_mut().enumerate().take(mr) {
            // SAFETY: row i < mr of A holds kcp pairs (contract).
            let (ahi, alo) = unpair(unsafe { *a.add(i * lda + p) });
            for ((r, &h), &l) in row.iter_mut().zip(&bhi).zip(&blo) {
                *r = ftz(ftz(*r + ahi * h) + alo * l);
            }
        }
    }
    for (i, row) in acc.iter().enumerate().take(mr) {
        // SAFETY: row i < mr of C holds nr writable columns (contract).
        let cr = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), nr) };
        cr.copy_from_slice(&row[..nr]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in `[-1, 1)` with a spread of magnitudes.
    fn data(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                (u * 2.0 - 1.0) * if s & 7 == 0 { 8.0 } else { 1.0 }
            })
            .collect()
    }

    /// The kernels this CPU runs, each with whether it follows the reference's chain bit for
    /// bit (the AMX tiles accumulate in their own way: checked within the rounding bound).
    fn kernels() -> Vec<(&'static str, Kernel, bool)> {
        let mut v = vec![("portable", PORTABLE, true)];
        #[cfg(target_arch = "x86_64")]
        if native_supported() {
            v.push(("avx512bf16", super::super::x86::gemm_bf16::KERNEL, true));
        }
        if amx_supported() {
            v.push(("amx", kernel(), false));
        }
        v
    }

    #[test]
    fn amx_kernel_is_tested_or_skipped() {
        if amx_supported() {
            eprintln!("bf16 tests: the AMX-BF16 kernel runs in every product test");
        } else {
            eprintln!("bf16 tests: no AMX on this CPU (or no permission): AMX kernel SKIPPED");
        }
    }

    /// The fused bias and GELU equal the product followed by `add_bias` and `gelu_rational`
    /// bit for bit, for every kernel: several column blocks (`n > NC`) with a partial one, a
    /// depth over two blocks, row and column splits, accumulation, and an empty depth.
    #[test]
    fn epilogue_equals_the_separate_passes() {
        for (name, kern, _) in kernels() {
            for (m, n, k) in [(3, 300, 2 * 2 * KCP + 7), (40, 2 * NC + 9, 33), (17, 5, 0)] {
                let x = data(m * k, 11);
                let w = data(n * k, 12);
                let bias = data(n, 13);
                let pw = Bf16Weights::from_f32(n, k, &w).unwrap();
                for (accumulate, gelu) in [(false, true), (true, false), (true, true)] {
                    let y0 = data(m * n, 14);
                    let mut want = y0.clone();
                    gemm_with(
                        kern,
                        m,
                        n,
                        k,
                        &x,
                        &pw,
                        &mut want,
                        n,
                        accumulate,
                        Finish::default(),
                    )
                    .unwrap();
                    super::super::add_bias(&mut want, &bias);
                    if gelu {
                        super::super::gelu_rational(&mut want);
                    }
                    let mut got = y0;
                    let fin = Finish {
                        bias: Some(&bias),
                        gelu,
                    };
                    gemm_with(kern, m, n, k, &x, &pw, &mut got, n, accumulate, fin).unwrap();
                    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            e.to_bits(),
                            "{name} {m}x{n}x{k} acc {accumulate} gelu {gelu} [{i}]: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rounding_is_nearest_even_with_daz() {
        assert_eq!(round_to_bf16(1.0), 0x3f80);
        // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(round_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(round_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(round_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(round_to_bf16(-1e-40), 0x8000);
        assert_eq!(round_to_bf16(f32::MAX), 0x7f80);
        assert_eq!(round_to_bf16(f32::NAN) & 0x7fc0, 0x7fc0);
        assert_eq!(bf16_to_f32(0xc040), -3.0);
    }

    #[test]
    fn packed_layout_round_trips() {
        let (n, k) = (37, 2 * KCP + 5);
        let w = data(n * k, 3);
        let pw = Bf16Weights::from_f32(n, k, &w).unwrap();
        for j in 0..n {
            for q in 0..k {
                assert_eq!(pw.get(j, q), round_to_bf16(w[j * k + q]), "({j}, {q})");
            }
        }
        assert!(Bf16Weights::from_f32(n, k, &w[1..]).is_err());
        let bits: Vec<u16> = vec![0x0001, 0x8001, 0x3f80, 0x4000];
        let pb = Bf16Weights::from_bf16(2, 2, &bits).unwrap();
        assert_eq!(
            [pb.get(0, 0), pb.get(0, 1), pb.get(1, 0)],
            [0, 0x8000, 0x3f80]
        );
    }

    /// Runs every kernel and the reference on one shape; all must agree bit for bit. Also
    /// compares with the f32 GEMM on the bf16-rounded inputs, which differs only by summation
    /// order: within a few ulp of the sum of |products| per output.
    fn check_shape(m: usize, n: usize, k: usize, ldy: usize, accumulate: bool) {
        let x = data(m * k, (m * 31 + k) as u64);
        let wf = data(n * k, (n * 17 + k) as u64 + 1);
        let wbits: Vec<u16> = wf.iter().map(|&v| round_to_bf16(v)).collect();
        let w = Bf16Weights::from_bf16(n, k, &wbits).unwrap();
        let y0 = data(m * ldy, 99);
        let mut want = y0.clone();
        gemm_bt_bf16_reference(m, n, k, &x, &wbits, &mut want, ldy, accumulate).unwrap();
        let xr: Vec<f32> = x.iter().map(|&v| bf16_to_f32(round_to_bf16(v))).collect();
        let wr: Vec<f32> = wbits.iter().map(|&b| bf16_to_f32(b)).collect();
        for (name, kern, exact) in kernels() {
            let mut got = y0.clone();
            gemm_with(
                kern,
                m,
                n,
                k,
                &x,
                &w,
                &mut got,
                ldy,
                accumulate,
                Finish::default(),
            )
            .unwrap();
            for (idx, (g, r)) in got.iter().zip(&want).enumerate() {
                if exact {
                    assert_eq!(
                        g.to_bits(),
                        r.to_bits(),
                        "{name} m{m} n{n} k{k} ldy{ldy} acc{accumulate} at {idx}: {g} vs {r}"
                    );
                    continue;
                }
                // Within the f32 rounding bound of the exact dot product (f64) of the
                // rounded inputs: (k + 2) ulp of the sum of |products|.
                let (i, j) = (idx / ldy, idx % ldy);
                if j >= n {
                    assert_eq!(g.to_bits(), r.to_bits(), "{name}: column {j} >= n written");
                    continue;
                }
                let base = if accumulate { y0[idx] as f64 } else { 0.0 };
                let (mut dot, mut mag) = (base, base.abs());
                for q in 0..k {
                    let p = xr[i * k + q] as f64 * wr[j * k + q] as f64;
                    dot += p;
                    mag += p.abs();
                }
                let tol = mag * (k as f64 + 2.0) * f32::EPSILON as f64;
                assert!(
                    (*g as f64 - dot).abs() <= tol,
                    "{name} m{m} n{n} k{k} ldy{ldy} acc{accumulate} at ({i},{j}): {g} vs {dot}"
                );
            }
        }
        // Against the f32 GEMM on the rounded inputs.
        let mut f = y0.clone();
        super::super::gemm_bt(m, n, k, &xr, k, &wr, k, &mut f, ldy, accumulate);
        for i in 0..m {
            for j in 0..n {
                let base = if accumulate {
                    y0[i * ldy + j].abs()
                } else {
                    0.0
                };
                let mag: f32 = base
                    + (0..k)
                        .map(|q| (xr[i * k + q] * wr[j * k + q]).abs())
                        .sum::<f32>();
                let (a, b) = (want[i * ldy + j], f[i * ldy + j]);
                let tol = mag * (k as f32 + 2.0) * f32::EPSILON;
                assert!(
                    (a - b).abs() <= tol,
                    "f32 m{m} n{n} k{k} ({i},{j}): {a} vs {b}"
                );
            }
        }
        // Columns past n in each row are untouched.
        let mut got = y0.clone();
        gemm_bt_bf16(m, n, k, &x, &w, &mut got, ldy, accumulate, None, false).unwrap();
        for i in 0..m {
            assert_eq!(
                got[i * ldy + n..(i + 1) * ldy],
                y0[i * ldy + n..(i + 1) * ldy]
            );
        }
    }

    #[test]
    fn awkward_shapes_match_reference_exactly() {
        for m in [1, 7, 33] {
            for n in [1, 7, 33, 1000] {
                for k in [1, 7, 33, 1000] {
                    for accumulate in [false, true] {
                        check_shape(m, n, k, n + 3, accumulate);
                    }
                }
            }
        }
    }

    #[test]
    fn threaded_shapes_match_reference_exactly() {
        // Large enough to be split over two threads, by rows (130 >= 4·MR·2) and by columns,
        // with several depth blocks.
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        pool.install(|| {
            check_shape(130, 300, 2 * 2 * KCP + 3, 301, true);
            check_shape(20, 1000, 700, 1000, false);
        });
    }

    #[test]
    fn empty_and_bad_shapes() {
        let w = Bf16Weights::from_f32(3, 0, &[]).unwrap();
        let mut y = vec![5.0f32; 6];
        gemm_bt_bf16(2, 3, 0, &[], &w, &mut y, 3, true, None, false).unwrap();
        assert_eq!(y, vec![5.0; 6]);
        gemm_bt_bf16(2, 3, 0, &[], &w, &mut y, 3, false, None, false).unwrap();
        assert_eq!(y, vec![0.0; 6]);
        let w = Bf16Weights::from_f32(3, 4, &[1.0; 12]).unwrap();
        assert!(gemm_bt_bf16(2, 3, 4, &[1.0; 7], &w, &mut y, 3, false, None, false).is_err());
        assert!(gemm_bt_bf16(2, 3, 4, &[1.0; 8], &w, &mut y[..5], 3, false, None, false).is_err());
        assert!(gemm_bt_bf16(2, 3, 4, &[1.0; 8], &w, &mut y, 2, false, None, false).is_err());
        assert!(gemm_bt_bf16(2, 4, 3, &[1.0; 8], &w, &mut y, 4, false, None, false).is_err());
        gemm_bt_bf16(2, 3, 4, &[1.0; 8], &w, &mut y, 3, false, None, false).unwrap();
        // A bias that is not one per output.
        assert!(gemm_bt_bf16(
            2,
            3,
            4,
            &[1.0; 8],
            &w,
            &mut y,
            3,
            false,
            Some(&[0.0; 2]),
            false
        )
        .is_err());
        assert_eq!(y, vec![4.0; 6]);
    }

    /// Which per-pair arithmetic each kernel follows, as fractions of outputs bit-equal to
    /// four candidate chains (printed, which is how AMX's was measured; the vector kernels must
    /// follow the reference's odd-first chain everywhere).
    #[test]
    fn report_pair_arithmetic() {
        let (m, n, k) = (40, 64, 96);
        let x = data(m * k, 5);
        let wf = data(n * k, 6);
        let wbits: Vec<u16> = wf.iter().map(|&v| round_to_bf16(v)).collect();
        let w = Bf16Weights::from_bf16(n, k, &wbits).unwrap();
        let xr: Vec<f32> = x.iter().map(|&v| bf16_to_f32(round_to_bf16(v))).collect();
        let wr: Vec<f32> = wbits.iter().map(|&b| bf16_to_f32(b)).collect();
        let chain = |i: usize, j: usize, variant: usize| -> f32 {
            let mut acc = 0.0f32;
            for p in 0..k / 2 {
                let (x0, x1) = (xr[i * k + 2 * p], xr[i * k + 2 * p + 1]);
                let (w0, w1) = (wr[j * k + 2 * p], wr[j * k + 2 * p + 1]);
                acc = match variant {
                    0 => (acc + x1 * w1) + x0 * w0,
                    1 => (acc + x0 * w0) + x1 * w1,
                    2 => (acc as f64 + x0 as f64 * w0 as f64 + x1 as f64 * w1 as f64) as f32,
                    _ => acc + (x0 * w0 + x1 * w1),
                };
            }
            acc
        };
        for (name, kern, exact) in kernels() {
            let mut y = vec![0.0f32; m * n];
            gemm_with(kern, m, n, k, &x, &w, &mut y, n, false, Finish::default()).unwrap();
            let rates: Vec<String> = (0..4)
                .map(|v| {
                    let hits = (0..m * n)
                        .filter(|&o| y[o].to_bits() == chain(o / n, o % n, v).to_bits())
                        .count();
                    format!("{:.3}", hits as f64 / (m * n) as f64)
                })
                .collect();
            eprintln!(
                "bf16 pair arithmetic, {name}: odd-first {}, even-first {}, fused pair {}, \
                 rounded pair {}",
                rates[0], rates[1], rates[2], rates[3]
            );
            if exact {
                assert_eq!(
                    rates[0], "1.000",
                    "{name} should follow the odd-first chain"
                );
            }
        }
    }

    #[test]
    fn flush_to_zero_matches_instruction() {
        // acc = 1.5·2^-126; + (-2^-126) gives a subnormal, flushed to 0; + 2^-126 gives
        // 2^-126 (checked on the instruction). Pair order: high (odd depth) first.
        let t = bf16_to_f32(0x2000); // 2^-63
        let x = [t, t];
        let w = [0x2000u16, 0xa000];
        let pw = Bf16Weights::from_bf16(1, 2, &w).unwrap();
        let mut want = [1.5 * f32::MIN_POSITIVE];
        gemm_bt_bf16_reference(1, 1, 2, &x, &w, &mut want, 1, true).unwrap();
        assert_eq!(want[0], f32::MIN_POSITIVE);
        for (name, kern, exact) in kernels() {
            let mut got = [1.5 * f32::MIN_POSITIVE];
            gemm_with(kern, 1, 1, 2, &x, &pw, &mut got, 1, true, Finish::default()).unwrap();
            // AMX keeps the subnormal intermediate (measured on the instruction): the exact
            // result, 1.5 · 2^-126.
            let expect = if exact {
                want[0]
            } else {
                1.5 * f32::MIN_POSITIVE
            };
            assert_eq!(got[0].to_bits(), expect.to_bits(), "{name}");
        }
    }
}
