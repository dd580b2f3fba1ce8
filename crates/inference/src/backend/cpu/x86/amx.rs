//! AMX (Intel Advanced Matrix Extensions, Sapphire Rapids and later): detection, with the
//! permission Linux wants before a process touches the tile registers, the tile configuration,
//! and the AMX-BF16 microkernel of the bf16 GEMM (`bf16.rs` owns the packed layout, the
//! driver and the arithmetic; the activation conversion is AVX512-BF16's, `gemm_bf16.rs`), and
//! the AMX-INT8 tile of `Int8Matrix` (`int8.rs` owns the layout; the ternary driver runs it).
//!
//! Tiles (palette 1): 8 registers of up to 16 rows × 64 bytes. `tdpbf16ps c, a, b` multiplies
//! an A tile of 16 rows × 16 bf16 pairs by a B tile of 16 pairs × 16 columns (each 64-byte row
//! holds one depth pair of 16 columns: exactly a half-row of a [`NR`]-wide panel of
//! `Bf16Weights`) into a C tile of 16 × 16 f32. The microkernel computes up to 32 × 32 outputs
//! as four C tiles (tmm0..3) from two A tiles (tmm4, 5) and two B tiles (tmm6, 7), 16 depth
//! pairs per step; a depth tail of fewer than 16 pairs runs from scratch copies padded with
//! pairs whose products are −0, which adding leaves every sum (and every zero's sign) as it was.
//!
//! Rust has no stable AMX intrinsics, so the instructions are inline assembly; nothing else
//! in the process uses the tile registers, and each thread loads its tile configuration
//! before its first product (and again only when the tile shapes change).

use core::arch::asm;
use core::arch::x86_64::{__cpuid_count, _mm_prefetch, _MM_HINT_T0};
use std::cell::Cell;
use std::sync::OnceLock;

use super::super::bf16::{Kernel, NR};

/// Rows of the AMX microkernel's tile (two A tiles of 16).
pub(in crate::backend::cpu) const MR: usize = 32;

/// The AMX-BF16 kernel; `bf16::kernel` hands it out only after [`available`].
pub(in crate::backend::cpu) const KERNEL: Kernel = Kernel {
    ukr,
    cvt: super::gemm_bf16::KERNEL.cvt,
    mr: MR,
    whole_depth: true,
    name: "amx-bf16",
};

/// Whether this process may run the AMX-BF16 kernel: the CPU has AMX-TILE and AMX-BF16 (and
/// AVX512-BF16 for the activation conversion), the OS manages the tile state (XCR0), and Linux
/// granted the permission (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). Asked once;
/// `LATTICE_AMX=0` turns AMX off (to measure what it brings).
pub fn available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| enabled() && std::is_x86_feature_detected!("avx512bf16") && detect(AMX_BF16))
}

/// Whether this process may run the AMX-INT8 tile of `Int8Matrix` ([`int8_tile`]): AMX-TILE
/// and AMX-INT8, the tile state managed and permitted as for [`available`]; `LATTICE_AMX=0`
/// turns it off too.
pub fn int8_available() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| enabled() && detect(AMX_INT8))
}

/// `LATTICE_AMX` is not `0`.
fn enabled() -> bool {
    std::env::var("LATTICE_AMX").map_or(true, |v| v != "0")
}

/// CPUID.(EAX=7, ECX=0):EDX bits: AMX-BF16, AMX-TILE, AMX-INT8.
const AMX_BF16: u32 = 1 << 22;
const AMX_TILE: u32 = 1 << 24;
const AMX_INT8: u32 = 1 << 25;

/// The CPU has AMX-TILE and `feature`, the OS saves the tile state and Linux permits it.
fn detect(feature: u32) -> bool {
    if !(std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("xsave")) {
        return false;
    }
    let leaf7 = __cpuid_count(7, 0);
    if leaf7.edx & feature == 0 || leaf7.edx & AMX_TILE == 0 {
        return false;
    }
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves the tile state.
    let (lo, _hi): (u32, u32);
    // SAFETY: `xgetbv` with ECX = 0 reads XCR0; XSAVE (checked above) implies the instruction
    // exists and OSXSAVE is what `is_x86_feature_detected!("xsave")` requires.
    unsafe {
        asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack));
    }
    if lo & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    request_permission()
}

/// Linux: the tile data state is off for a process until it asks (kernel 5.16 and later).
#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted XSAVE
    // features; it reads and writes no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    r == 0
}

#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    false
}

/// The palette-1 tile configuration for a microkernel call of `mr` rows (≤ 32) and `nr`
/// columns (≤ 32): C tiles 0..3 (rows 0-15 / 16-31 × columns 0-15 / 16-31), A tiles 4, 5
/// (their rows, 16 pairs), B tiles 6, 7 (16 pairs, their columns). Tiles of an empty part
/// stay unconfigured (and unused).
fn config(mr: usize, nr: usize) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[0] = 1; // palette
    let (top, bottom) = (mr.min(16), mr.saturating_sub(16));
    let (left, right) = (nr.min(16), nr.saturating_sub(16));
    let mut tile = |t: usize, rows: usize, colsb: usize| {
        if rows > 0 && colsb > 0 {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
            c[48 + t] = rows as u8;
        }
    };
    tile(0, top, 4 * left);
    tile(1, top, 4 * right);
    tile(2, bottom, 4 * left);
    tile(3, bottom, 4 * right);
    tile(4, top, 64);
    tile(5, bottom, 64);
    tile(6, 16, 4 * left);
    tile(7, 16, 4 * right);
    c
}

thread_local! {
    /// The `(mr, nr)` this thread's tile configuration was loaded for (0 = none yet).
    static LOADED: Cell<usize> = const { Cell::new(0) };
}

/// Loads the configuration for `(mr, nr)` unless this thread has it loaded already.
///
/// # Safety
/// The CPU has AMX and this process has the permission ([`available`]).
unsafe fn configure(mr: usize, nr: usize) {
    let key = (mr << 8) | nr;
    if LOADED.get() == key {
        return;
    }
    let cfg = config(mr, nr);
    // SAFETY: `cfg` is a valid 64-byte palette-1 configuration (rows ≤ 16, colsb ≤ 64).
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly)) };
    LOADED.set(key);
}

/// Loads or stores one tile register (`$t`, e.g. "tmm4") from / to `$p` with a row stride of
/// `$stride` bytes.
macro_rules! tile_load {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tileloadd ", $t, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) $stride,
             options(nostack, readonly))
    };
}
macro_rules! tile_store {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], ", $t), p = in(reg) $p, s = in(reg) $stride,
             options(nostack))
    };
}
macro_rules! tile_dp {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbf16ps ", $c, ", ", $a, ", ", $b),
            options(nostack, nomem)
        )
    };
}

/// Panel rows (depth pairs, 128 bytes each) that [`ukr`] prefetches into L1 ahead of the
/// ones it loads, running on into the driver's next panel; A's rows are prefetched
/// [`PREFETCH_A_PAIRS`] ahead. The operands stream from L2 and the tile loads would wait on
/// them (measured in `probe` below).
const PREFETCH_PAIRS: usize = 64;
/// Depth pairs ahead that [`ukr`] prefetches each A row.
const PREFETCH_A_PAIRS: usize = 32;

/// Prefetches into L1 the 16 panel rows from row `t` of the panel at `b` (`kcp` rows), or, past
/// its end, of the panel at `next_b` (none if null).
#[inline(always)]
fn prefetch_panel(b: *const u32, next_b: *const u32, kcp: usize, t: usize) {
    let row = if t < kcp {
        b.wrapping_add(t * NR)
    } else if !next_b.is_null() && t - kcp < kcp {
        next_b.wrapping_add((t - kcp) * NR)
    } else {
        return;
    };
    let row = row.cast::<i8>();
    for line in 0..16 * NR * 4 / 64 {
        // SAFETY: a prefetch is a hint: it never faults and changes no architectural state.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(64 * line)) };
    }
}

/// The microkernel (`bf16::Ukr`) for up to [`MR`] × [`NR`] outputs.
///
/// # Safety
/// The `bf16::Ukr` contract with `mr ≤ 32`; AMX available ([`available`]).
#[allow(clippy::too_many_arguments)]
unsafe fn ukr(
    kcp: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    next_b: *const u32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    load_c: bool,
) {
    debug_assert!((1..=MR).contains(&mr) && (1..=NR).contains(&nr));
    let (bottom, right) = (mr > 16, nr > 16);
    let (sa, sb, sc) = (lda * 4, NR * 4, ldc * 4);
    // SAFETY (whole body): AMX is available (contract) and the configuration matches (mr,
    // nr), so every tile access stays inside its configured rows and columns: C rows < mr
    // and columns < nr (contract: readable and writable), A rows < mr of kcp pairs (lda apart),
    // B rows < kcp of the panel (NR pairs each), and the scratch arrays below; the prefetches
    // of A rows and panels ahead are hints that never fault.
    unsafe {
        configure(mr, nr);
        let c1 = c.wrapping_add(16);
        let (c2, c3) = (c.wrapping_add(16 * ldc), c.wrapping_add(16 * ldc + 16));
        if load_c {
            tile_load!("tmm0", c, sc);
            if right {
                tile_load!("tmm1", c1, sc);
            }
            if bottom {
                tile_load!("tmm2", c2, sc);
                if right {
                    tile_load!("tmm3", c3, sc);
                }
            }
        } else {
            asm!("tilezero tmm0", options(nostack, nomem));
            if right {
                asm!("tilezero tmm1", options(nostack, nomem));
            }
            if bottom {
                asm!("tilezero tmm2", options(nostack, nomem));
                if right {
                    asm!("tilezero tmm3", options(nostack, nomem));
                }
            }
        }
        let step = |a0: *const u32, sa: usize, b0: *const u32| {
            let a1 = a0.cast::<u8>().wrapping_add(16 * sa);
            let b1 = b0.wrapping_add(16);
            tile_load!("tmm4", a0, sa);
            tile_load!("tmm6", b0, sb);
            tile_dp!("tmm0", "tmm4", "tmm6");
            if right {
                tile_load!("tmm7", b1, sb);
                tile_dp!("tmm1", "tmm4", "tmm7");
            }
            if bottom {
                tile_load!("tmm5", a1, sa);
                tile_dp!("tmm2", "tmm5", "tmm6");
                if right {
                    tile_dp!("tmm3", "tmm5", "tmm7");
                }
            }
        };
        let full = kcp - kcp % 16;
        for p in (0..full).step_by(16) {
            prefetch_panel(b, next_b, kcp, p + PREFETCH_PAIRS);
            if p + PREFETCH_A_PAIRS < kcp {
                for i in 0..mr {
                    let line = a.wrapping_add(i * lda + p + PREFETCH_A_PAIRS).cast::<i8>();
                    _mm_prefetch::<_MM_HINT_T0>(line);
                }
            }
            step(a.add(p), sa, b.add(p * NR));
        }
        let tail = kcp - full;
        if tail > 0 {
            // A pads with pairs of −0, B with zeros: each padded product is −0.
            let mut at = [0x8000_8000u32; MR * 16];
            let mut bt = [0u32; 16 * NR];
            for i in 0..mr {
                let src = core::slice::from_raw_parts(a.add(i * lda + full), tail);
                at[i * 16..i * 16 + tail].copy_from_slice(src);
            }
            bt[..tail * NR]
                .copy_from_slice(core::slice::from_raw_parts(b.add(full * NR), tail * NR));
            step(at.as_ptr(), 64, bt.as_ptr());
        }
        tile_store!("tmm0", c, sc);
        if right {
            tile_store!("tmm1", c1, sc);
        }
        if bottom {
            tile_store!("tmm2", c2, sc);
            if right {
                tile_store!("tmm3", c3, sc);
            }
        }
    }
}

macro_rules! tile_dp_int8 {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(
            concat!("tdpbsud ", $c, ", ", $a, ", ", $b),
            options(nostack, nomem)
        )
    };
}

/// Activation rows at most per [`int8_tile`] call (two A tiles of 16).
pub(in crate::backend::cpu) const INT8_MR: usize = 32;

/// The AMX-INT8 tile of `Int8Matrix`: one group (32 weight rows) times `mr` (≤ 32) activation
/// rows over the full depth, sums minus `a.xsum` (128 · Σ x) as the vector tiles give them.
///
/// `tdpbsud` multiplies an A tile of 16 activation rows × 64 signed bytes by a B tile of 16
/// rows of 4 depths × 16 columns of unsigned bytes: one 64-byte half of an `Int8Matrix` chunk
/// (4 columns of 16 weight rows) is exactly one B row, so the 16 chunks of a depth step load as
/// one tile with a stride of 128 bytes. Four C tiles (tmm0..3: activation rows 0-15 / 16-31 ×
/// weight rows 0-15 / 16-31), A tiles tmm4/5, B tiles tmm6/7. A depth tail of fewer than 16
/// chunks runs from scratch copies whose padding activations are 0.
///
/// # Safety
/// [`int8_available`]; the int8 tile contract (`int8::tile8`) with `mr ≤ 32` rows.
pub(in crate::backend::cpu) unsafe fn int8_tile(
    a: &crate::backend::cpu::ternary::TileArgs,
    mr: usize,
) {
    debug_assert!((1..=INT8_MR).contains(&mr));
    let bottom = mr > 16;
    let (sa, so) = (a.ldx, a.ldo * 4);
    const SB: usize = 128;
    // SAFETY (whole body): AMX-INT8 is available and the configuration matches (mr, 32), so
    // every tile access stays inside its configured rows: A rows < mr of the activation rows
    // (ldx apart, 4·nch bytes each), B rows inside the group's nch chunks, C rows < mr of the
    // output (32 i32 each, ldo apart), and the scratch arrays below (contract).
    unsafe {
        configure(mr, 32);
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        if bottom {
            asm!("tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        }
        let step = |x0: *const i8, sa: usize, w0: *const u8| {
            tile_load!("tmm4", x0, sa);
            tile_load!("tmm6", w0, SB);
            tile_load!("tmm7", w0.wrapping_add(64), SB);
            tile_dp_int8!("tmm0", "tmm4", "tmm6");
            tile_dp_int8!("tmm1", "tmm4", "tmm7");
            if bottom {
                tile_load!("tmm5", x0.wrapping_add(16 * sa), sa);
                tile_dp_int8!("tmm2", "tmm5", "tmm6");
                tile_dp_int8!("tmm3", "tmm5", "tmm7");
            }
        };
        let full = a.nch - a.nch % 16;
        for c in (0..full).step_by(16) {
            step(a.x.add(4 * c), sa, a.w.add(SB * c));
        }
        let tail = a.nch - full;
        if tail > 0 {
            let mut xt = [0i8; INT8_MR * 64];
            for r in 0..mr {
                let src = core::slice::from_raw_parts(a.x.add(r * a.ldx + 4 * full), 4 * tail);
                xt[r * 64..r * 64 + 4 * tail].copy_from_slice(src);
            }
            let mut wt = [0x80u8; 16 * SB];
            wt[..SB * tail]
                .copy_from_slice(core::slice::from_raw_parts(a.w.add(SB * full), SB * tail));
            step(xt.as_ptr(), 64, wt.as_ptr());
        }
        let o = a.out;
        tile_store!("tmm0", o, so);
        tile_store!("tmm1", o.add(16), so);
        if bottom {
            tile_store!("tmm2", o.add(16 * a.ldo), so);
            tile_store!("tmm3", o.add(16 * a.ldo + 16), so);
        }
        for r in 0..mr {
            let s = *a.xsum.add(r);
            for v in core::slice::from_raw_parts_mut(o.add(r * a.ldo), 32) {
                *v -= s;
            }
        }
    }
}

/// Activation rows per call of [`q8_0_tile`] (one A tile).
pub(in crate::backend::cpu) const Q8_MR: usize = 16;

/// Bytes of one block's record of a 16-row group in the `repack` layout for Q8_0: 512 code
/// bytes (8 rows of 64, one B tile), then 16 f16 scales (`repack::record_bytes`).
const Q8_REC: usize = 544;

/// Calls of [`q8_0_tile`] with fewer activation rows run the AVX-512 VNNI tile instead (a tile
/// product of a few rows costs what one of 16 does).
const Q8_AMX_MIN_ROWS: usize = 8;

/// The tile configuration of [`q8_0_tile`] for `mr` (≤ 16) activation rows: C tiles 0, 1
/// (`mr` rows of 16 i32), A tiles 2, 3 (`mr` rows of one block's 32 codes), B tiles 4, 5 (the
/// 8 rows of 64 bytes of one block of a 16-row group in the `repack` layout).
fn q8_config(mr: usize) -> [u8; 64] {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut tile = |t: usize, rows: usize, colsb: usize| {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&(colsb as u16).to_le_bytes());
        c[48 + t] = rows as u8;
    };
    for t in 0..2 {
        tile(t, mr, 64);
        tile(2 + t, mr, 32);
        tile(4 + t, 8, 64);
    }
    c
}

/// Loads [`q8_config`] unless this thread has it loaded (the key space above the `(mr, nr)`
/// keys of [`configure`]).
///
/// # Safety
/// As [`configure`], for AMX-INT8 ([`int8_available`]).
unsafe fn configure_q8(mr: usize) {
    let key = 1 << 16 | mr;
    if LOADED.get() == key {
        return;
    }
    let cfg = q8_config(mr);
    // SAFETY: `cfg` is a valid palette-1 configuration (rows ≤ 16, colsb ≤ 64).
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.as_ptr(), options(nostack, readonly)) };
    LOADED.set(key);
}

/// The Q8_0 tile of the quantized tables (`qdot::Tile`) on AMX-INT8: one group of 16 weight
/// rows (`repack` layout: per block, 8 vectors of 4 codes × 16 rows, then 16 f16 scales) times
/// `mr` (≤ [`Q8_MR`]) activation rows over the whole depth, into `out` (`mr` rows of 16).
///
/// Per block, `tdpbsud` multiplies an A tile (`mr` rows × the block's 32 signed activation
/// codes) by the block's 8 × 64 weight bytes as they lie (unsigned codes, 4 depths × 16 rows a
/// row): the same exact i32 sums as the VNNI tile's `vpdpbusd` chain; then, as there, the sum
/// plus its offset correction, converted and multiplied into the row's accumulator
/// (`acc += f32(isum) · (d_w · d_a)`, one FMA), block after block: bit-identical to every
/// other table. Two blocks are in flight (tiles 0/2/4 and 1/3/5) so the tile unit works while
/// the vector unit scales the previous sums. Fewer than 8 rows go to the VNNI tile.
///
/// # Safety
/// [`int8_available`] and AVX-512 VNNI; the `qdot::Tile` contract for Q8_0 with `mr ≤ 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")]
pub(in crate::backend::cpu) unsafe fn q8_0_tile(
    w: *const u8,
    a: &crate::quant::act::QActs,
    r0: usize,
    mr: usize,
    out: *mut f32,
) {
    debug_assert!((1..=Q8_MR).contains(&mr));
    let vnni = super::qdot_avx512::QTABLE.q8_0;
    let vnni_rows = super::super::qdot::VECTOR_TILE_ROWS;
    // SAFETY: the same contract, split into calls the VNNI tile takes, or handed to the AMX
    // body with its row count as a constant.
    unsafe {
        if mr < Q8_AMX_MIN_ROWS {
            for r in (0..mr).step_by(vnni_rows) {
                vnni(w, a, r0 + r, (mr - r).min(vnni_rows), out.add(16 * r));
            }
            return;
        }
        match mr {
            8 => q8_0_amx::<8>(w, a, r0, out),
            9 => q8_0_amx::<9>(w, a, r0, out),
            10 => q8_0_amx::<10>(w, a, r0, out),
            11 => q8_0_amx::<11>(w, a, r0, out),
            12 => q8_0_amx::<12>(w, a, r0, out),
            13 => q8_0_amx::<13>(w, a, r0, out),
            14 => q8_0_amx::<14>(w, a, r0, out),
            15 => q8_0_amx::<15>(w, a, r0, out),
            _ => q8_0_amx::<16>(w, a, r0, out),
        }
    }
}

/// [`q8_0_tile`]'s AMX body for `MR` rows.
///
/// # Safety
/// As [`q8_0_tile`] with `mr = MR`.
#[inline(always)]
unsafe fn q8_0_amx<const MR: usize>(
    w: *const u8,
    a: &crate::quant::act::QActs,
    r0: usize,
    out: *mut f32,
) {
    use core::arch::x86_64::*;
    let k = a.k;
    let nb = k / 32;
    let x = a.qs.as_ptr().wrapping_add(r0 * k);
    let mut sums = [[0i32; 16]; 2 * Q8_MR];
    let sp = sums.as_mut_ptr().cast::<i32>();
    let sp1 = sp.wrapping_add(16 * Q8_MR);
    // SAFETY (whole body): AMX-INT8 and AVX-512 are available (contract) and the tile
    // configuration is `q8_config(MR)`: A tiles read MR rows of 32 codes of block b inside the
    // activation rows r0..r0+MR (k apart), B tiles the 512 code bytes of block b's record, C
    // tiles store MR rows of 64 bytes into `sums`; the scalar reads stay inside rows < r0 + MR
    // of `d` and `corr` (nb per row), and `out` has MR rows of 16 floats.
    unsafe {
        configure_q8(MR);
        let mut acc = [_mm512_setzero_ps(); MR];
        let mut b = 0;
        while b + 2 <= nb {
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            tile_load!("tmm2", x.add(32 * b), k);
            tile_load!("tmm4", w.add(b * Q8_REC), 64usize);
            tile_dp_int8!("tmm0", "tmm2", "tmm4");
            tile_load!("tmm3", x.add(32 * (b + 1)), k);
            tile_load!("tmm5", w.add((b + 1) * Q8_REC), 64usize);
            tile_dp_int8!("tmm1", "tmm3", "tmm5");
            tile_store!("tmm0", sp, 64usize);
            tile_store!("tmm1", sp1, 64usize);
            q8_scale(w, a, r0, b, sp, &mut acc);
            q8_scale(w, a, r0, b + 1, sp1, &mut acc);
            b += 2;
        }
        if b < nb {
            asm!("tilezero tmm0", options(nostack, nomem));
            tile_load!("tmm2", x.add(32 * b), k);
            tile_load!("tmm4", w.add(b * Q8_REC), 64usize);
            tile_dp_int8!("tmm0", "tmm2", "tmm4");
            tile_store!("tmm0", sp, 64usize);
            q8_scale(w, a, r0, b, sp, &mut acc);
        }
        for (r, ar) in acc.iter().enumerate() {
            _mm512_storeu_ps(out.add(16 * r), *ar);
        }
    }
}

/// Block `b`'s scaling step of [`q8_0_amx`]: row `r`'s 16 sums at `s + 16r`, plus the row's
/// offset correction, times `d_w · d_a`, added into `acc[r]` with one FMA.
///
/// # Safety
/// AVX-512; `s` holds `MR` rows of 16 sums; block `b`'s record and rows `r0..r0 + MR` of `a`
/// exist.
#[inline(always)]
unsafe fn q8_scale<const MR: usize>(
    w: *const u8,
    a: &crate::quant::act::QActs,
    r0: usize,
    b: usize,
    s: *const i32,
    acc: &mut [core::arch::x86_64::__m512; MR],
) {
    use core::arch::x86_64::*;
    let nb = a.k / 32;
    let (ad, corr) = (a.d.as_ptr(), a.corr.as_ptr());
    // SAFETY: the contract (the scale vector follows the block's 512 code bytes).
    unsafe {
        let dw = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(b * Q8_REC + 512).cast()));
        for (r, ar) in acc.iter_mut().enumerate() {
            let row = (r0 + r) * nb + b;
            let isum = _mm512_add_epi32(
                _mm512_loadu_si512(s.add(16 * r).cast()),
                _mm512_set1_epi32(*corr.add(row)),
            );
            let dd = _mm512_mul_ps(dw, _mm512_set1_ps(*ad.add(row)));
            *ar = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), dd, *ar);
        }
    }
}

#[cfg(test)]
mod probe {
    use super::*;
    use std::time::Instant;

    /// What the bf16 tile unit does on one core, printed (ignored; `cargo test --release --lib
    /// amx_probe -- --ignored --nocapture`): `tdpbf16ps` from registers, then [`ukr`] over
    /// the whole depth with panels and A rows from L2 and outputs 1,024 floats apart, A rows
    /// as many bytes apart as their pairs (a power of two) or an odd number of cache lines.
    #[test]
    #[ignore]
    fn amx_probe() {
        if !available() {
            eprintln!("amx_probe: no AMX-BF16 on this CPU: SKIPPED");
            return;
        }
        let n = 2_000_000u64;
        let seconds;
        // SAFETY: AMX is available; the tiles are configured for 32 × 32 and loaded from a
        // buffer of 32 rows of 128 bytes.
        unsafe {
            configure(32, 32);
            let a = vec![0x3f80_3f80u32; 32 * 32];
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3"
            );
            tile_load!("tmm4", a.as_ptr(), 64usize);
            tile_load!("tmm5", a.as_ptr(), 64usize);
            tile_load!("tmm6", a.as_ptr(), 128usize);
            tile_load!("tmm7", a.as_ptr(), 128usize);
            let t = Instant::now();
            for _ in 0..n {
                tile_dp!("tmm0", "tmm4", "tmm6");
                tile_dp!("tmm1", "tmm4", "tmm7");
                tile_dp!("tmm2", "tmm5", "tmm6");
                tile_dp!("tmm3", "tmm5", "tmm7");
            }
            seconds = t.elapsed().as_secs_f64();
        }
        let flops = (n * 4 * 16 * 16 * 32 * 2) as f64;
        eprintln!(
            "tdpbf16ps from registers: {:.0} GFLOP/s",
            flops / seconds / 1e9
        );
        const PANELS: usize = 8;
        for kp in [512usize, 1792] {
            for lda in [kp, (kp.div_ceil(16) | 1) * 16] {
                let a = vec![0x3f80_3f80u32; 32 * lda];
                let b = vec![0x3f80_3f80u32; kp * NR * PANELS];
                let mut c = vec![0f32; 32 * 1024];
                let reps = 40_000_000 / kp;
                let t = Instant::now();
                for r in 0..reps {
                    let (j, next) = (r % PANELS, (r + 1) % PANELS);
                    // SAFETY: the ukr contract: 32 A rows of kp pairs lda apart, a panel of
                    // kp·NR pairs, 32 output rows of 32 (at column 32j < 1024) 1,024 apart.
                    unsafe {
                        ukr(
                            kp,
                            a.as_ptr(),
                            lda,
                            b.as_ptr().add(j * kp * NR),
                            b.as_ptr().add(next * kp * NR),
                            c.as_mut_ptr().add(j * 32),
                            1024,
                            32,
                            32,
                            false,
                        )
                    };
                }
                let gflops = (reps * 32 * 32 * kp * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
                eprintln!("ukr, {kp} pairs deep, A rows {lda} pairs apart: {gflops:.0} GFLOP/s");
            }
        }
    }
}
