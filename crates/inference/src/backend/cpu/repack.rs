//! The CPU kernel layout of a quantized matrix (owned by [`QuantMatrix`](super::QuantMatrix),
//! read by the `qdot` / `qkernels` tiles): rows in groups of 16, blocks of a group stored
//! together with the same element of the 16 rows side by side, so that one 64-byte load holds
//! 4 consecutive codes of each of 16 rows (one i32 lane per row). A dot-product instruction
//! (`vpdpbusd`) with 4 activation codes broadcast then yields 16 row sums at once, with no
//! horizontal reductions, and each loaded weight vector serves several activation rows.
//!
//! Codes are stored unsigned (the activation side corrects for the offset, see `QActs`); the
//! scales of the 16 rows follow the codes of each block. Per group and block (`R` = row in
//! group, `i` = byte in lane; "vec j" = 64 bytes at `64j`, lane `R` at `+4R`):
//!
//! | type | codes | then |
//! |------|-------|------|
//! | Q4_0 | vec j<4: `qs[4j+i]` (low nibble: value `4j+i`, high: `16+4j+i`) | `d[16]` f16 (288 B) |
//! | Q4_1 | as Q4_0 | `d[16]`, `m[16]` (320 B) |
//! | Q5_0 | as Q4_0; then 64 B high bits: lane R byte i bit j = bit of value `4j+i`, bit `4+j` = value `16+4j+i` | `d[16]` (352 B) |
//! | Q8_0 | vec j<8: `qs[4j+i] ^ 0x80` | `d[16]` (544 B) |
//! | Q4_K | vec v<32: `qs[4v+i]` (chunk `v%8` of sub-blocks `2(v/8)`, `2(v/8)+1`) | `sc[8][16]` u8, `m[4][16][2]` u8, `d[16]`, `dmin[16]` (2368 B) |
//! | Q6_K | 16 chunks `c = 8h + 4s + j` (h, s < 2, j < 4) of 192 B: `ql[4v+i]`, `ql[4v+32+i]`, `qh[4u+i]` with `v = 16h + 4s + j`, `u = 8h + 4s + j` | `sc[16][16]` i8, `d[16]` (3360 B) |
//!
//! Within a record the kernels read the bytes in order (the hardware prefetchers follow a
//! forward stream; Q6_K's chunks put together the three vectors one step uses).
//! The layout is exactly invertible ([`unrepack_block`]), so nothing else is stored. A trailing
//! partial group is padded with zero rows (zero scales).

use crate::quant::{q4k_pack_scales, q4k_scale_min, QuantType};

/// Weight rows per group of the repacked layout (a trailing partial group is zero-padded).
pub const GROUP_ROWS: usize = 16;

/// Bytes of one group's record for one block of `t` (a quantized type).
pub fn record_bytes(t: QuantType) -> usize {
    match t {
        QuantType::Q4_0 => 288,
        QuantType::Q4_1 => 320,
        QuantType::Q5_0 => 352,
        QuantType::Q8_0 => 544,
        QuantType::Q4_K => 2368,
        QuantType::Q6_K => 3360,
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => 0,
    }
}

/// The `ql` vector `v` (the next one is `v + 8`) and `qh` vector `u` of Q6_K chunk `c`.
#[inline(always)]
pub(crate) fn q6k_chunk(c: usize) -> (usize, usize) {
    let (h, jp) = (c / 8, c % 8);
    (16 * h + jp, 8 * h + jp)
}

/// Writes row `r` (0..16) of block `raw` (GGUF bytes) into the group record `rec`.
pub(crate) fn repack_block(t: QuantType, raw: &[u8], r: usize, rec: &mut [u8]) {
    let lanes = |rec: &mut [u8], base: usize, nvec: usize, src: &[u8], xor: u8| {
        for v in 0..nvec {
            for i in 0..4 {
                rec[base + 64 * v + 4 * r + i] = src[4 * v + i] ^ xor;
            }
        }
    };
    match t {
        QuantType::Q4_0 => {
            lanes(rec, 0, 4, &raw[2..18], 0);
            rec[256 + 2 * r..258 + 2 * r].copy_from_slice(&raw[0..2]);
        }
        QuantType::Q4_1 => {
            lanes(rec, 0, 4, &raw[4..20], 0);
            rec[256 + 2 * r..258 + 2 * r].copy_from_slice(&raw[0..2]);
            rec[288 + 2 * r..290 + 2 * r].copy_from_slice(&raw[2..4]);
        }
        QuantType::Q5_0 => {
            lanes(rec, 0, 4, &raw[6..22], 0);
            let qh = u32::from_le_bytes([raw[2], raw[3], raw[4], raw[5]]);
            for i in 0..4 {
                let mut b = 0u8;
                for j in 0..4 {
                    b |= (((qh >> (4 * j + i)) & 1) as u8) << j;
                    b |= (((qh >> (16 + 4 * j + i)) & 1) as u8) << (4 + j);
                }
                rec[256 + 4 * r + i] = b;
            }
            rec[320 + 2 * r..322 + 2 * r].copy_from_slice(&raw[0..2]);
        }
        QuantType::Q8_0 => {
            lanes(rec, 0, 8, &raw[2..34], 0x80);
            rec[512 + 2 * r..514 + 2 * r].copy_from_slice(&raw[0..2]);
        }
        QuantType::Q4_K => {
            lanes(rec, 0, 32, &raw[16..144], 0);
            for b in 0..8 {
                let (sc, m) = q4k_scale_min(b, &raw[4..16]);
                rec[2048 + 16 * b + r] = sc;
                rec[2176 + 32 * (b / 2) + 2 * r + b % 2] = m;
            }
            rec[2304 + 2 * r..2306 + 2 * r].copy_from_slice(&raw[0..2]);
            rec[2336 + 2 * r..2338 + 2 * r].copy_from_slice(&raw[2..4]);
        }
        QuantType::Q6_K => {
            for c in 0..16 {
                let (v, u) = q6k_chunk(c);
                lanes(rec, 192 * c, 1, &raw[4 * v..], 0);
                lanes(rec, 192 * c + 64, 1, &raw[4 * v + 32..], 0);
                lanes(rec, 192 * c + 128, 1, &raw[128 + 4 * u..], 0);
            }
            for b in 0..16 {
                rec[3072 + 16 * b + r] = raw[192 + b];
            }
            rec[3328 + 2 * r..3330 + 2 * r].copy_from_slice(&raw[208..210]);
        }
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("float type"),
    }
}

/// Reads row `r` of the group record `rec` back into GGUF block bytes `raw` (inverse of
/// [`repack_block`]).
pub(crate) fn unrepack_block(t: QuantType, rec: &[u8], r: usize, raw: &mut [u8]) {
    let lanes = |dst: &mut [u8], base: usize, nvec: usize, xor: u8| {
        for v in 0..nvec {
            for i in 0..4 {
                dst[4 * v + i] = rec[base + 64 * v + 4 * r + i] ^ xor;
            }
        }
    };
    match t {
        QuantType::Q4_0 => {
            lanes(&mut raw[2..18], 0, 4, 0);
            raw[0..2].copy_from_slice(&rec[256 + 2 * r..258 + 2 * r]);
        }
        QuantType::Q4_1 => {
            lanes(&mut raw[4..20], 0, 4, 0);
            raw[0..2].copy_from_slice(&rec[256 + 2 * r..258 + 2 * r]);
            raw[2..4].copy_from_slice(&rec[288 + 2 * r..290 + 2 * r]);
        }
        QuantType::Q5_0 => {
            lanes(&mut raw[6..22], 0, 4, 0);
            let mut qh = 0u32;
            for i in 0..4 {
                let b = rec[256 + 4 * r + i];
                for j in 0..4 {
                    qh |= (((b >> j) & 1) as u32) << (4 * j + i);
                    qh |= (((b >> (4 + j)) & 1) as u32) << (16 + 4 * j + i);
                }
            }
            raw[2..6].copy_from_slice(&qh.to_le_bytes());
            raw[0..2].copy_from_slice(&rec[320 + 2 * r..322 + 2 * r]);
        }
        QuantType::Q8_0 => {
            lanes(&mut raw[2..34], 0, 8, 0x80);
            raw[0..2].copy_from_slice(&rec[512 + 2 * r..514 + 2 * r]);
        }
        QuantType::Q4_K => {
            lanes(&mut raw[16..144], 0, 32, 0);
            let mut sc = [0u8; 8];
            let mut m = [0u8; 8];
            for b in 0..8 {
                sc[b] = rec[2048 + 16 * b + r];
                m[b] = rec[2176 + 32 * (b / 2) + 2 * r + b % 2];
            }
            raw[4..16].copy_from_slice(&q4k_pack_scales(&sc, &m));
            raw[0..2].copy_from_slice(&rec[2304 + 2 * r..2306 + 2 * r]);
            raw[2..4].copy_from_slice(&rec[2336 + 2 * r..2338 + 2 * r]);
        }
        QuantType::Q6_K => {
            for c in 0..16 {
                let (v, u) = q6k_chunk(c);
                lanes(&mut raw[4 * v..], 192 * c, 1, 0);
                lanes(&mut raw[4 * v + 32..], 192 * c + 64, 1, 0);
                lanes(&mut raw[128 + 4 * u..], 192 * c + 128, 1, 0);
            }
            for b in 0..16 {
                raw[192 + b] = rec[3072 + 16 * b + r];
            }
            raw[208..210].copy_from_slice(&rec[3328 + 2 * r..3330 + 2 * r]);
        }
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => unreachable!("float type"),
    }
}

/// Repacks `n` rows of `k` values (GGUF row-major blocks, `data` exactly `n · row_bytes`) into
/// the group layout: `ceil(n/16)` groups, each `k / block_len` records.
pub(crate) fn repack(t: QuantType, n: usize, k: usize, data: &[u8]) -> Vec<u8> {
    let bb = t.block_bytes();
    let nb = k / t.block_len();
    let rec = record_bytes(t);
    let groups = n.div_ceil(GROUP_ROWS);
    let mut out = vec![0u8; groups * nb * rec];
    for (row, raw_row) in data.chunks_exact(nb * bb).enumerate().take(n) {
        let (g, r) = (row / GROUP_ROWS, row % GROUP_ROWS);
        for b in 0..nb {
            let o = (g * nb + b) * rec;
            repack_block(t, &raw_row[b * bb..(b + 1) * bb], r, &mut out[o..o + rec]);
        }
    }
    out
}
