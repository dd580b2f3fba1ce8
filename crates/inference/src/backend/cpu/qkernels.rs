//! The quantized dot-product tiles, written once over the [`QSimd`] vocabulary and instantiated
//! per instruction set (AVX-512 VNNI, AVX2, portable) by `qdot::quant_table!`.
//!
//! A tile computes, for one group of 16 weight rows in the layout of `repack` and `MR`
//! (up to `qdot::QTable::rows`) consecutive activation rows of a [`QActs`], the 16 × `MR`
//! dot products over the full depth. Each weight vector is loaded and unpacked once and used
//! for the `MR` activation rows.
//! Integer sums per block (per sub-block for the K-quants, times the integer sub-block scale)
//! are exact; per block, `acc += f32(isum) · (d_w · d_a)` with one rounding per operation and a
//! fused multiply-add, identically in every instruction set, so all tables give bit-identical
//! results.

use super::qdot::QSimd;
use crate::quant::act::QActs;

/// Q4_0 tag for [`tile_legacy`].
pub(crate) const T_Q4_0: u8 = 0;
/// Q4_1 tag.
pub(crate) const T_Q4_1: u8 = 1;
/// Q5_0 tag.
pub(crate) const T_Q5_0: u8 = 2;
/// Q8_0 tag.
pub(crate) const T_Q8_0: u8 = 3;

/// Four activation codes at `p` as one little-endian i32.
///
/// # Safety
/// `p..p + 4` readable.
#[inline(always)]
unsafe fn y4(p: *const i8) -> i32 {
    // SAFETY: caller.
    unsafe { (p as *const i32).read_unaligned() }
}

/// `v << (4 - j)` per 16-bit lane, `j` in 0..4 (moves bit `j` of each byte to bit 4).
#[inline(always)]
fn hb_lo<S: QSimd>(s: S, v: S::I, j: usize) -> S::I {
    match j {
        0 => s.sll16::<4>(v),
        1 => s.sll16::<3>(v),
        2 => s.sll16::<2>(v),
        _ => s.sll16::<1>(v),
    }
}

/// `v >> j` per 16-bit lane, `j` in 0..4 (moves bit `4 + j` of each byte to bit 4).
#[inline(always)]
fn hb_hi<S: QSimd>(s: S, v: S::I, j: usize) -> S::I {
    match j {
        0 => v,
        1 => s.srl16::<1>(v),
        2 => s.srl16::<2>(v),
        _ => s.srl16::<3>(v),
    }
}

/// Q4_0 / Q4_1 / Q5_0 / Q8_0 (blocks of 32) tile; `T` is one of the `T_*` tags.
///
/// # Safety
/// `w` points at the `nb = a.k / 32` records of one group; rows `r0..r0 + MR` exist in `a`
/// (quantized for this weight type); `out` has `MR × 16` writable floats (row stride 16).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index walks several per-row arrays
pub(crate) unsafe fn tile_legacy<S: QSimd, const T: u8, const MR: usize>(
    s: S,
    w: *const u8,
    a: &QActs,
    r0: usize,
    out: *mut f32,
) {
    let k = a.k;
    let nb = k / 32;
    let (rec, dpos) = match T {
        T_Q4_0 => (288, 256),
        T_Q4_1 => (320, 256),
        T_Q5_0 => (352, 320),
        _ => (544, 512),
    };
    let qs = a.qs.as_ptr();
    let ad = a.d.as_ptr();
    let corr = a.corr.as_ptr();
    let asum = a.s.as_ptr();
    let m4 = s.splat(0x0F0F_0F0F);
    let bit4 = s.splat(0x1010_1010);
    // SAFETY (whole body): offsets stay inside the records and activation rows (contract).
    unsafe {
        for h in 0..16 / S::ROWS {
            let lane = 4 * S::ROWS * h;
            let sco = 2 * S::ROWS * h;
            let mut acc = [s.zero_f(); MR];
            for b in 0..nb {
                let blk = w.add(b * rec);
                // Two accumulators per row (even / odd chunks) halve the dependency chains.
                let mut isum = [s.zero(); MR];
                let mut isum2 = [s.zero(); MR];
                if T != T_Q4_1 {
                    for (r, v) in isum.iter_mut().enumerate() {
                        *v = s.splat(*corr.add((r0 + r) * nb + b));
                    }
                }
                let yb = |r: usize, e: usize| y4(qs.add((r0 + r) * k + 32 * b + e));
                if T == T_Q8_0 {
                    for j in 0..4 {
                        let c = s.load(blk.add(128 * j + lane));
                        let c2 = s.load(blk.add(128 * j + 64 + lane));
                        for r in 0..MR {
                            isum[r] = s.dot_u8(isum[r], c, yb(r, 8 * j));
                            isum2[r] = s.dot_u8(isum2[r], c2, yb(r, 8 * j + 4));
                        }
                    }
                } else {
                    let hb = if T == T_Q5_0 {
                        s.load(blk.add(256 + lane))
                    } else {
                        s.zero()
                    };
                    for j in 0..4 {
                        let q = s.load(blk.add(64 * j + lane));
                        let mut lo = s.and(q, m4);
                        let mut hi = s.and(s.srl16::<4>(q), m4);
                        if T == T_Q5_0 {
                            lo = s.or(lo, s.and(hb_lo(s, hb, j), bit4));
                            hi = s.or(hi, s.and(hb_hi(s, hb, j), bit4));
                        }
                        for r in 0..MR {
                            isum[r] = s.dot(isum[r], lo, yb(r, 4 * j));
                            isum2[r] = s.dot(isum2[r], hi, yb(r, 16 + 4 * j));
                        }
                    }
                }
                for r in 0..MR {
                    isum[r] = s.add(isum[r], isum2[r]);
                }
                let dx = s.load_f16(blk.add(dpos + sco));
                for r in 0..MR {
                    let dd = s.mul_f(dx, s.splat_f(*ad.add((r0 + r) * nb + b)));
                    acc[r] = s.fma_f(s.cvt(isum[r]), dd, acc[r]);
                    if T == T_Q4_1 {
                        let mx = s.load_f16(blk.add(288 + sco));
                        acc[r] = s.fma_f(mx, s.splat_f(*asum.add((r0 + r) * nb + b)), acc[r]);
                    }
                }
            }
            for (r, v) in acc.iter().enumerate() {
                s.store_f(out.add(16 * r + S::ROWS * h), *v);
            }
        }
    }
}

/// Q4_K tile (super-blocks of 256: 8 sub-blocks of 32 with 6-bit scales and mins).
///
/// # Safety
/// As [`tile_legacy`], with `nb = a.k / 256` records of 2368 bytes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index walks several per-row arrays
pub(crate) unsafe fn tile_q4_k<S: QSimd, const MR: usize>(
    s: S,
    w: *const u8,
    a: &QActs,
    r0: usize,
    out: *mut f32,
) {
    let k = a.k;
    let nb = k / 256;
    let qs = a.qs.as_ptr();
    let ad = a.d.as_ptr();
    let corr = a.corr.as_ptr();
    let m4 = s.splat(0x0F0F_0F0F);
    // SAFETY (whole body): offsets stay inside the records and activation rows (contract).
    unsafe {
        for h in 0..16 / S::ROWS {
            let lane = 4 * S::ROWS * h;
            let mut acc = [s.zero_f(); MR];
            for b in 0..nb {
                let blk = w.add(b * 2368);
                let mut isum = [s.zero(); MR];
                for p in 0..4 {
                    let mut tl = [s.zero(); MR];
                    let mut th = [s.zero(); MR];
                    for j in 0..8 {
                        let q = s.load(blk.add(64 * (8 * p + j) + lane));
                        let lo = s.and(q, m4);
                        let hi = s.and(s.srl16::<4>(q), m4);
                        for r in 0..MR {
                            let y = qs.add((r0 + r) * k + 256 * b + 64 * p + 4 * j);
                            tl[r] = s.dot(tl[r], lo, y4(y));
                            th[r] = s.dot(th[r], hi, y4(y.add(32)));
                        }
                    }
                    let scl = s.load_u8_i32(blk.add(2048 + 32 * p + S::ROWS * h));
                    let sch = s.load_u8_i32(blk.add(2048 + 32 * p + 16 + S::ROWS * h));
                    for r in 0..MR {
                        isum[r] = s.add(isum[r], s.mullo(tl[r], scl));
                        isum[r] = s.add(isum[r], s.mullo(th[r], sch));
                    }
                }
                let dx = s.load_f16(blk.add(2304 + 2 * S::ROWS * h));
                let dm = s.load_f16(blk.add(2336 + 2 * S::ROWS * h));
                for r in 0..MR {
                    // Mins: Σ_sub m · Σy, two sub-blocks per i16-pair product.
                    let mut msum = s.zero();
                    for p in 0..4 {
                        let mp = s.load_u8x2_i16(blk.add(2176 + 32 * p + 2 * S::ROWS * h));
                        let ys = *corr.add((r0 + r) * a.corr_per_row + 4 * b + p);
                        msum = s.dot_i16(msum, mp, ys);
                    }
                    let dy = *ad.add((r0 + r) * nb + b);
                    acc[r] = s.fma_f(s.cvt(isum[r]), s.mul_f(dx, s.splat_f(dy)), acc[r]);
                    acc[r] = s.fma_f(s.cvt(msum), s.mul_f(dm, s.splat_f(-dy)), acc[r]);
                }
            }
            for (r, v) in acc.iter().enumerate() {
                s.store_f(out.add(16 * r + S::ROWS * h), *v);
            }
        }
    }
}

/// Q6_K tile (super-blocks of 256: 16 sub-blocks of 16 with i8 scales).
///
/// # Safety
/// As [`tile_legacy`], with `nb = a.k / 256` records of 3360 bytes.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // one index walks several per-row arrays
pub(crate) unsafe fn tile_q6_k<S: QSimd, const MR: usize>(
    s: S,
    w: *const u8,
    a: &QActs,
    r0: usize,
    out: *mut f32,
) {
    let k = a.k;
    let nb = k / 256;
    let qs = a.qs.as_ptr();
    let ad = a.d.as_ptr();
    let corr = a.corr.as_ptr();
    let m4 = s.splat(0x0F0F_0F0F);
    let m30 = s.splat(0x3030_3030);
    // SAFETY (whole body): offsets stay inside the records and activation rows (contract).
    unsafe {
        for h in 0..16 / S::ROWS {
            let lane = 4 * S::ROWS * h;
            let mut acc = [s.zero_f(); MR];
            for b in 0..nb {
                let blk = w.add(b * 3360);
                let mut isum = [s.zero(); MR];
                for half in 0..2 {
                    for sg in 0..2 {
                        // t[q][r]: sub-block 8·half + 2q + sg, started at -32·Σy.
                        let mut t = [[s.zero(); MR]; 4];
                        for (q, tq) in t.iter_mut().enumerate() {
                            for (r, v) in tq.iter_mut().enumerate() {
                                let sub = 16 * b + 8 * half + 2 * q + sg;
                                *v = s.splat(*corr.add((r0 + r) * a.corr_per_row + sub));
                            }
                        }
                        for jj in 0..4 {
                            let jp = 4 * sg + jj;
                            // Chunk 8·half + jp: ql vectors jp and jp + 8, qh vector jp.
                            let ch = blk.add(192 * (8 * half + jp) + lane);
                            let qa = s.load(ch);
                            let qb = s.load(ch.add(64));
                            let qh = s.load(ch.add(128));
                            let c = [
                                s.or(s.and(qa, m4), s.and(s.sll16::<4>(qh), m30)),
                                s.or(s.and(qb, m4), s.and(s.sll16::<2>(qh), m30)),
                                s.or(s.and(s.srl16::<4>(qa), m4), s.and(qh, m30)),
                                s.or(s.and(s.srl16::<4>(qb), m4), s.and(s.srl16::<2>(qh), m30)),
                            ];
                            for r in 0..MR {
                                let y = qs.add((r0 + r) * k + 256 * b + 128 * half + 4 * jp);
                                for q in 0..4 {
                                    t[q][r] = s.dot(t[q][r], c[q], y4(y.add(32 * q)));
                                }
                            }
                        }
                        for (q, tq) in t.iter().enumerate() {
                            let sub = 8 * half + 2 * q + sg;
                            let sc = s.load_i8_i32(blk.add(3072 + 16 * sub + S::ROWS * h));
                            for r in 0..MR {
                                isum[r] = s.add(isum[r], s.mullo(tq[r], sc));
                            }
                        }
                    }
                }
                let dx = s.load_f16(blk.add(3328 + 2 * S::ROWS * h));
                for r in 0..MR {
                    let dy = s.splat_f(*ad.add((r0 + r) * nb + b));
                    acc[r] = s.fma_f(s.cvt(isum[r]), s.mul_f(dx, dy), acc[r]);
                }
            }
            for (r, v) in acc.iter().enumerate() {
                s.store_f(out.add(16 * r + S::ROWS * h), *v);
            }
        }
    }
}
