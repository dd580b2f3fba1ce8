//! Ternary (BitNet b1.58) weight formats: how checkpoints and GGUF files store a matrix whose
//! values are −1, 0 or +1 times one per-tensor scale, decoded to the values (row-major i8) and
//! the scale, for the CPU backend's `TernaryMatrix`.
//!
//! - transformers' packed `uint8 [out/4, in]` (`integrations/bitnet.py` `pack_weights`): row `r`
//!   of quarter `q = r / (out/4)` sits in bits `2q` of stored row `r mod out/4`, as code `w + 1`;
//! - GGUF TQ2_0 (llama.cpp, 256 values in 64 bytes of 2-bit codes + an f16 scale per block);
//! - GGUF TQ1_0 (256 values as base-3 digits, 5 per byte then 4 per byte, + an f16 scale);
//! - GGUF I2_S as bitnet.cpp writes it (ggml type 36): 2-bit codes in blocks of 128 values,
//!   value `j` of a block in bits `6 − 2(j / 32)` of byte `j mod 32`, one f32 scale after all
//!   codes, the tensor padded to `n/4 + 32` bytes.
//!
//! GGUF's TQ blocks carry a scale each; a BitNet matrix has one, so a file whose non-zero
//! blocks disagree is refused rather than approximated.

use super::blocks::{f16_at, f16_bytes};

/// GGML type id of TQ1_0.
pub const GGML_TQ1_0: u32 = 34;
/// GGML type id of TQ2_0.
pub const GGML_TQ2_0: u32 = 35;
/// GGML type id bitnet.cpp gives I2_S.
pub const GGML_I2_S: u32 = 36;

/// How a ternary layer's scale turns the integer products into outputs. Both forms exist in
/// transformers and are kept apart so results match it to the rounding of each.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TernaryScale {
    /// `y = Σ / (x_scale · s)` (transformers' `BitLinear`: `s = 1 / mean|W|`).
    Divide(f32),
    /// `y = Σ / x_scale · s` (`AutoBitLinear`, the GGUF formats: `s = mean|W|`).
    Multiply(f32),
}

/// Byte size of a GGML ternary tensor of `n` values (`None` for other types or ragged sizes).
pub fn ggml_ternary_bytes(ggml_type: u32, n: u64) -> Option<u64> {
    match ggml_type {
        GGML_TQ1_0 if n.is_multiple_of(256) => Some(n / 256 * 54),
        GGML_TQ2_0 if n.is_multiple_of(256) => Some(n / 256 * 66),
        GGML_I2_S if n.is_multiple_of(128) => Some(n / 4 + 32),
        _ => None,
    }
}

/// Decodes transformers' packed layout (`packed` = `[out/4, in]` bytes) to values `[out, in]`.
pub fn unpack_hf(packed: &[u8], out_dim: usize, in_dim: usize) -> Result<Vec<i8>, String> {
    if !out_dim.is_multiple_of(4) || packed.len() != out_dim / 4 * in_dim {
        return Err(format!(
            "packed ternary weights of {} bytes do not hold [{out_dim}, {in_dim}] \
             (want [{} , {in_dim}] bytes, {out_dim} a multiple of 4)",
            packed.len(),
            out_dim / 4
        ));
    }
    let quarter = out_dim / 4;
    let mut out = vec![0i8; out_dim * in_dim];
    for (r, row) in out.chunks_exact_mut(in_dim.max(1)).enumerate() {
        let (src, shift) = (r % quarter.max(1), 2 * (r / quarter.max(1)));
        for (o, &b) in row
            .iter_mut()
            .zip(&packed[src * in_dim..(src + 1) * in_dim])
        {
            *o = code_value((b >> shift) & 3)?;
        }
    }
    Ok(out)
}

/// Decodes a GGUF ternary tensor of `n` values: the values and the scale they share.
pub fn decode_ggml(ggml_type: u32, bytes: &[u8], n: usize) -> Result<(Vec<i8>, f32), String> {
    let want = ggml_ternary_bytes(ggml_type, n as u64)
        .ok_or_else(|| format!("GGML type {ggml_type} is not a ternary type for {n} values"))?;
    // I2_S's padding after the scale may be cut off at the end of a file.
    let need = if ggml_type == GGML_I2_S {
        n / 4 + 4
    } else {
        want as usize
    };
    if bytes.len() < need {
        return Err(format!(
            "{} bytes hold no {n} ternary values (want {need})",
            bytes.len()
        ));
    }
    let mut out = vec![0i8; n];
    match ggml_type {
        GGML_I2_S => {
            for (b, block) in out.chunks_exact_mut(128).enumerate() {
                for (j, o) in block.iter_mut().enumerate() {
                    let byte = bytes[b * 32 + j % 32];
                    *o = code_value((byte >> (6 - 2 * (j / 32))) & 3)?;
                }
            }
            let s = f32::from_le_bytes(bytes[n / 4..n / 4 + 4].try_into().expect("4 bytes"));
            Ok((out, s))
        }
        _ => {
            let block_bytes = if ggml_type == GGML_TQ2_0 { 66 } else { 54 };
            let mut scale: Option<f32> = None;
            for (b, block) in out.chunks_exact_mut(256).enumerate() {
                let raw = &bytes[b * block_bytes..(b + 1) * block_bytes];
                let d = f16_at(raw, block_bytes - 2);
                if ggml_type == GGML_TQ2_0 {
                    decode_tq2_block(raw, block)?;
                } else {
                    decode_tq1_block(raw, block)?;
                }
                // All-zero blocks carry whatever scale (llama.cpp writes 0): skip them.
                if block.iter().any(|&v| v != 0) {
                    match scale {
                        None => scale = Some(d),
                        Some(s) if s == d => {}
                        Some(s) => {
                            return Err(format!(
                                "block {b} has scale {d} where earlier blocks have {s}: a \
                                 BitNet matrix has one scale per tensor"
                            ))
                        }
                    }
                }
            }
            Ok((out, scale.unwrap_or(0.0)))
        }
    }
}

/// transformers' `WeightQuant` (BitNet's online ternarization of master weights `w`):
/// `s = 1 / max(mean|w|, 1e-5)`, values `clamp(round_half_even(w · s), −1, 1)`, each standing
/// for `±1 / s`; returns the values and `1 / s` (the [`TernaryScale::Multiply`] factor).
pub fn ternarize_absmean(w: &[f32]) -> (Vec<i8>, f32) {
    let mean = (w.iter().map(|&v| f64::from(v.abs())).sum::<f64>() / w.len().max(1) as f64) as f32;
    let s = 1.0 / mean.max(1e-5);
    let values = w
        .iter()
        .map(|&v| (v * s).round_ties_even().clamp(-1.0, 1.0) as i8)
        .collect();
    (values, 1.0 / s)
}

/// Reads float weights that already are ternary (every value `0` or `±s` for one `s`, as
/// llama.cpp's converter writes BitNet weights into F32 / F16 / BF16 tensors): the values and
/// `s`, or `None` when they are not.
pub fn ternary_values(w: &[f32]) -> Option<(Vec<i8>, f32)> {
    let s = w.iter().map(|v| v.abs()).find(|&a| a != 0.0).unwrap_or(0.0);
    let values = w
        .iter()
        .map(|&v| match v {
            _ if v == 0.0 => Some(0),
            _ if v == s => Some(1),
            _ if v == -s => Some(-1),
            _ => None,
        })
        .collect::<Option<Vec<i8>>>()?;
    Some((values, s))
}

/// Encodes `values` (−1, 0, +1) times `scale` as GGML type `ggml_type`, byte for byte as
/// llama.cpp's `quantize_row_tq{1,2}_0_ref` (each block's scale its largest magnitude:
/// `scale`, or 0 when all its values are 0) or bitnet.cpp's
/// `quantize_i2_s` write them.
pub fn encode_ggml(ggml_type: u32, values: &[i8], scale: f32) -> Result<Vec<u8>, String> {
    let n = values.len();
    let size = ggml_ternary_bytes(ggml_type, n as u64)
        .ok_or_else(|| format!("GGML type {ggml_type} cannot hold {n} ternary values"))?;
    if values.iter().any(|v| !(-1..=1).contains(v)) {
        return Err("ternary values must be −1, 0 or +1".into());
    }
    let code = |v: i8| (v + 1) as u8;
    let mut out = vec![0u8; size as usize];
    match ggml_type {
        GGML_I2_S => {
            for (i, &v) in values.iter().enumerate() {
                let (block, j) = (i / 128, i % 128);
                out[block * 32 + j % 32] |= code(v) << (6 - 2 * (j / 32));
            }
            out[n / 4..n / 4 + 4].copy_from_slice(&scale.to_le_bytes());
        }
        GGML_TQ2_0 => {
            for (block, o) in values.chunks_exact(256).zip(out.chunks_exact_mut(66)) {
                for (e, &v) in block.iter().enumerate() {
                    o[32 * (e / 128) + e % 32] |= code(v) << (2 * ((e % 128) / 32));
                }
                o[64..].copy_from_slice(&f16_bytes(block_scale(block, scale)));
            }
        }
        _ => {
            // Base-3 digits, most significant first, as a fraction of 256 rounded up.
            let frac = |q: u16| (q * 256).div_ceil(243) as u8;
            for (block, o) in values.chunks_exact(256).zip(out.chunks_exact_mut(54)) {
                let mut e = 0;
                for (start, len) in [(0usize, 32usize), (32, 16)] {
                    for m in 0..len {
                        let q = (0..5)
                            .fold(0u16, |q, d| q * 3 + u16::from(code(block[e + m + d * len])));
                        o[start + m] = frac(q);
                    }
                    e += 5 * len;
                }
                for j in 0..4 {
                    let q = (0..4).fold(0u16, |q, d| q * 3 + u16::from(code(block[e + j + d * 4])));
                    o[48 + j] = frac(q * 3);
                }
                o[52..].copy_from_slice(&f16_bytes(block_scale(block, scale)));
            }
        }
    }
    Ok(out)
}

/// The scale llama.cpp writes for a block: its largest magnitude (0 for an all-zero block).
fn block_scale(block: &[i8], scale: f32) -> f32 {
    if block.iter().any(|&v| v != 0) {
        scale
    } else {
        0.0
    }
}

fn code_value(code: u8) -> Result<i8, String> {
    match code {
        0..=2 => Ok(code as i8 - 1),
        _ => Err("ternary code 3 (only 0, 1, 2 = −1, 0, +1 exist)".into()),
    }
}

/// One TQ2_0 block: value `e` is bits `2((e mod 128) / 32)` of byte `32(e / 128) + e mod 32`.
fn decode_tq2_block(raw: &[u8], out: &mut [i8]) -> Result<(), String> {
    for (e, o) in out.iter_mut().enumerate() {
        let byte = raw[32 * (e / 128) + e % 32];
        *o = code_value((byte >> (2 * ((e % 128) / 32))) & 3)?;
    }
    Ok(())
}

/// One TQ1_0 block (`qs[48]`, `qh[4]`): each byte holds base-3 digits as a fixed-point
/// fraction of 256; digit `n` is `((byte · 3ⁿ mod 256) · 3) >> 8`. Values 0..160 are the
/// 5 digits of bytes 0..32, 160..240 those of bytes 32..48, 240..256 the 4 of `qh`.
fn decode_tq1_block(raw: &[u8], out: &mut [i8]) -> Result<(), String> {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let digit = |byte: u8, n: usize| ((u16::from(byte.wrapping_mul(POW3[n])) * 3) >> 8) as u8;
    let mut e = 0;
    for (start, len, digits) in [(0usize, 32usize, 5usize), (32, 16, 5), (48, 4, 4)] {
        for n in 0..digits {
            for m in 0..len {
                out[e] = code_value(digit(raw[start + m], n))?;
                e += 1;
            }
        }
    }
    debug_assert_eq!(e, 256);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<i8> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) % 3) as i8 - 1
            })
            .collect()
    }

    #[test]
    fn hf_packing_round_trips() {
        // transformers' pack_weights, written out.
        let (out, inp) = (12, 5);
        let v = values(out * inp, 1);
        let q = out / 4;
        let mut packed = vec![0u8; q * inp];
        for r in 0..out {
            for c in 0..inp {
                packed[(r % q) * inp + c] |= ((v[r * inp + c] + 1) as u8) << (2 * (r / q));
            }
        }
        assert_eq!(unpack_hf(&packed, out, inp).unwrap(), v);
        assert!(unpack_hf(&packed, 10, inp).is_err());
        assert!(unpack_hf(&[0xff; 15], out, inp).is_err());
    }

    fn tq2(v: &[i8], d: f32) -> Vec<u8> {
        encode_ggml(GGML_TQ2_0, v, d).unwrap()
    }

    fn tq1(v: &[i8], d: f32) -> Vec<u8> {
        encode_ggml(GGML_TQ1_0, v, d).unwrap()
    }

    #[test]
    fn tq_blocks_decode_as_llama_cpp_writes_them() {
        let v = values(512, 2);
        let (got, s) = decode_ggml(GGML_TQ2_0, &tq2(&v, 0.25), 512).unwrap();
        assert_eq!((got, s), (v.clone(), 0.25));
        let (got, s) = decode_ggml(GGML_TQ1_0, &tq1(&v, 0.5), 512).unwrap();
        assert_eq!((got, s), (v.clone(), 0.5));
        // A second block with another scale is refused; an all-zero block is not.
        let mut mixed = tq2(&v[..256], 0.25);
        mixed.extend(tq2(&v[256..], 0.5));
        assert!(decode_ggml(GGML_TQ2_0, &mixed, 512).is_err());
        let mut zeros = tq2(&v[..256], 0.25);
        zeros.extend(tq2(&[0; 256], 0.0));
        assert_eq!(decode_ggml(GGML_TQ2_0, &zeros, 512).unwrap().1, 0.25);
        assert!(decode_ggml(GGML_TQ2_0, &tq2(&v, 1.0)[..100], 512).is_err());
    }

    #[test]
    fn absmean_ternarization_and_float_ternaries() {
        // mean|w| = 0.5 → s = 2: 0.2 → 0.4 → 0; 0.3 → 0.6 → 1; 0.25 → 0.5 → 0 (half to even);
        // 0.75 → 1.5 → 2 → clamped to 1.
        let w = [0.2, -0.3, 0.25, -0.75, 1.0, -0.5];
        let (v, m) = ternarize_absmean(&w);
        assert_eq!(v, vec![0, -1, 0, -1, 1, -1]);
        assert_eq!(m, 0.5);
        assert_eq!(
            ternary_values(&[0.0, 0.5, -0.5, 0.5]),
            Some((vec![0, 1, -1, 1], 0.5))
        );
        assert_eq!(ternary_values(&[0.0, 0.5, 0.25]), None);
        assert_eq!(ternary_values(&[0.0, 0.0]), Some((vec![0, 0], 0.0)));
    }

    #[test]
    fn i2s_decodes_as_bitnet_cpp_writes_it() {
        let n = 384;
        let v = values(n, 3);
        // bitnet.cpp's quantize_i2_s, written out.
        let mut bytes = vec![0u8; n / 4 + 32];
        for (i, &t) in v.iter().enumerate() {
            let (block, j) = (i / 128, i % 128);
            bytes[block * 32 + j % 32] |= ((t + 1) as u8) << (6 - 2 * (j / 32));
        }
        bytes[n / 4..n / 4 + 4].copy_from_slice(&0.75f32.to_le_bytes());
        assert_eq!(encode_ggml(GGML_I2_S, &v, 0.75).unwrap(), bytes);
        assert_eq!(decode_ggml(GGML_I2_S, &bytes, n).unwrap(), (v, 0.75));
        assert!(decode_ggml(GGML_I2_S, &bytes, 100).is_err());
        bytes[0] = 0xff;
        assert!(decode_ggml(GGML_I2_S, &bytes, n).is_err());
    }
}
