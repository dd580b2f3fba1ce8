//! GGUF block layouts and the scalar conversions between them and f32: `dequantize_row` for
//! every [`QuantType`] (bit-exact with ggml's `dequantize_row_*`), `quantize_row` for the float
//! types and the "reference" quantizers of Q4_0, Q4_1 and Q8_0 (bit-exact with ggml's
//! `quantize_row_*_ref`, the ones used to write model files).
//!
//! Block layouts (little-endian, `d`/`m`/`dmin` are IEEE f16):
//! - Q4_0 (32 values, 18 bytes): `d`, `qs[16]`; value `j` is `(nibble - 8) * d`, nibbles of
//!   byte `l` are values `l` (low) and `l + 16` (high).
//! - Q4_1 (32, 20): `d`, `m`, `qs[16]`; value = `nibble * d + m`.
//! - Q5_0 (32, 22): `d`, `qh: u32`, `qs[16]`; bit `j` of `qh` is the fifth bit of value `j`;
//!   value = `(q5 - 16) * d`.
//! - Q8_0 (32, 34): `d`, `qs: [i8; 32]`; value = `q * d`.
//! - Q4_K (256, 144): `d`, `dmin`, `scales[12]` (8 six-bit scales and mins), `qs[128]`;
//!   value = `d * sc * nibble - dmin * m` per sub-block of 32.
//! - Q6_K (256, 210): `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d`; value =
//!   `d * sc * (q6 - 32)` per sub-block of 16.

use half::{bf16, f16};

use super::QuantType;
use crate::{Error, Result};

/// Elements of a K-quant super-block.
pub const QK_K: usize = 256;

/// f16 bits at `b[o..o + 2]` as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], o: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[o], b[o + 1]])).to_f32()
}

/// f32 rounded to f16 (round to nearest even, as F16C), little-endian bytes.
#[inline(always)]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// f32 rounded to f16 and back (the value a stored f16 scale takes).
#[inline(always)]
pub(crate) fn f16_round(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// The six-bit scale and min of sub-block `j` (0..8) of a Q4_K `scales[12]` field.
#[inline(always)]
pub(crate) fn q4k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Packs eight six-bit scales and mins into a Q4_K `scales[12]` field (inverse of
/// [`q4k_scale_min`]).
pub(crate) fn q4k_pack_scales(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0x0F) | ((m[j + 4] & 0x0F) << 4);
    }
    q
}

/// The six-bit value `l` (0..256) of a Q6_K block, before subtracting 32.
#[inline(always)]
pub(crate) fn q6k_value(blk: &[u8], e: usize) -> u8 {
    let (h, r) = (e / 128, e % 128);
    let (quarter, l) = (r / 32, r % 32);
    let ql = &blk[64 * h..];
    let qh = blk[128 + 32 * h + l];
    let lo = match quarter {
        0 => ql[l] & 0x0F,
        1 => ql[l + 32] & 0x0F,
        2 => ql[l] >> 4,
        _ => ql[l + 32] >> 4,
    };
    lo | (((qh >> (2 * quarter)) & 3) << 4)
}

fn check_len(op: &'static str, t: QuantType, bytes: usize, n: usize) -> Result<()> {
    match t.row_bytes(n) {
        Some(b) if b == bytes => Ok(()),
        Some(b) => Err(Error::Shape {
            op,
            reason: format!("{} values of {} take {b} bytes, got {bytes}", n, t.name()),
        }),
        None => Err(Error::Shape {
            op,
            reason: format!(
                "{} values is not a multiple of the {} block of {}",
                n,
                t.name(),
                t.block_len()
            ),
        }),
    }
}

/// Decodes one row of `dst.len()` values of type `t` from `src`; bit-exact with ggml's
/// `dequantize_row_*` (f16 scales converted exactly, products in f32 in ggml's order).
///
/// Fails when `dst.len()` is not a multiple of the block length or `src` is not exactly the
/// row's size.
pub fn dequantize_row(t: QuantType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_len("dequantize_row", t, src.len(), dst.len())?;
    let bl = t.block_len();
    let bb = t.block_bytes();
    match t {
        QuantType::F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        QuantType::F16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        QuantType::BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
            }
        }
        _ => {
            for (y, blk) in dst.chunks_exact_mut(bl).zip(src.chunks_exact(bb)) {
                dequantize_block(t, blk, y);
            }
        }
    }
    Ok(())
}

/// Decodes one block (`blk.len() == t.block_bytes()`, `y.len() == t.block_len()`).
pub(crate) fn dequantize_block(t: QuantType, blk: &[u8], y: &mut [f32]) {
    match t {
        QuantType::Q4_0 => {
            let d = f16_at(blk, 0);
            for j in 0..16 {
                let q = blk[2 + j];
                y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        QuantType::Q4_1 => {
            let (d, m) = (f16_at(blk, 0), f16_at(blk, 2));
            for j in 0..16 {
                let q = blk[4 + j];
                y[j] = (q & 0x0F) as f32 * d + m;
                y[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
        QuantType::Q5_0 => {
            let d = f16_at(blk, 0);
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            for j in 0..16 {
                let q = blk[6 + j];
                let h0 = ((qh >> j) << 4) & 0x10;
                let h1 = (qh >> (j + 12)) & 0x10;
                y[j] = (((q & 0x0F) as u32 | h0) as i32 - 16) as f32 * d;
                y[j + 16] = (((q >> 4) as u32 | h1) as i32 - 16) as f32 * d;
            }
        }
        QuantType::Q8_0 => {
            let d = f16_at(blk, 0);
            for j in 0..32 {
                y[j] = blk[2 + j] as i8 as f32 * d;
            }
        }
        QuantType::Q4_K => {
            let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
            let scales = &blk[4..16];
            let qs = &blk[16..144];
            for s in 0..4 {
                let (sc1, m1) = q4k_scale_min(2 * s, scales);
                let (sc2, m2) = q4k_scale_min(2 * s + 1, scales);
                let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
                let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
                for l in 0..32 {
                    let q = qs[32 * s + l];
                    y[64 * s + l] = d1 * (q & 0x0F) as f32 - m1;
                    y[64 * s + 32 + l] = d2 * (q >> 4) as f32 - m2;
                }
            }
        }
        QuantType::Q6_K => {
            let d = f16_at(blk, 208);
            for (e, v) in y.iter_mut().enumerate() {
                let sc = blk[192 + e / 16] as i8;
                let q = q6k_value(blk, e) as i32 - 32;
                *v = d * sc as f32 * q as f32;
            }
        }
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("float types"),
    }
}

/// Encodes one row of `src.len()` values as type `t` into `dst`.
///
/// Supported: F32, F16, BF16 (round to nearest even), and Q4_0, Q4_1, Q8_0 exactly as ggml's
/// `quantize_row_*_ref` (the quantizers that write model files). Other types fail with
/// [`Error::InvalidInput`]; length errors with [`Error::Shape`].
pub fn quantize_row(t: QuantType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_len("quantize_row", t, dst.len(), src.len())?;
    match t {
        QuantType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        QuantType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f16_bytes(*s));
            }
        }
        QuantType::BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&bf16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        QuantType::Q8_0 => {
            for (x, blk) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16_bytes(d));
                for (q, v) in blk[2..].iter_mut().zip(x) {
                    *q = (v * id).round() as i8 as u8;
                }
            }
        }
        QuantType::Q4_0 => {
            for (x, blk) in src.chunks_exact(32).zip(dst.chunks_exact_mut(18)) {
                let (mut amax, mut max) = (0f32, 0f32);
                for &v in x {
                    if amax < v.abs() {
                        amax = v.abs();
                        max = v;
                    }
                }
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16_bytes(d));
                let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
                for j in 0..16 {
                    blk[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
        }
        QuantType::Q4_1 => {
            for (x, blk) in src.chunks_exact(32).zip(dst.chunks_exact_mut(20)) {
                let min = x.iter().fold(f32::MAX, |a, &v| if v < a { v } else { a });
                let max = x.iter().fold(-f32::MAX, |a, &v| if v > a { v } else { a });
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                blk[..2].copy_from_slice(&f16_bytes(d));
                blk[2..4].copy_from_slice(&f16_bytes(min));
                let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
                for j in 0..16 {
                    blk[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
                }
            }
        }
        _ => {
            return Err(Error::InvalidInput(format!(
                "quantize_row: no quantizer for {}",
                t.name()
            )))
        }
    }
    Ok(())
}
