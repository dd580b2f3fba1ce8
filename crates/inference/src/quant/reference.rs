//! The scalar reference of the quantized dot products: ggml's `ggml_vec_dot_*` generic code
//! re-expressed on raw GGUF blocks and a [`Q8Row`]. Integer sums per block are exact; the
//! float combination per block is `(d_w · d_a) · Σ` (`- (dmin_w · d_a) · Σmins` for Q4_K,
//! `+ m_w · s_a` for Q4_1), accumulated in f32 in block order. The SIMD kernels are tested
//! against this; it is far too slow for real use.

use super::act::{quantize_act, ActFormat, Q8Row};
use super::blocks::{f16_at, q4k_scale_min, q6k_value, QK_K};
use super::QuantType;

/// Dot product of one weight row (`w`, raw GGUF blocks of type `t`, a quantized type) with a
/// quantized activation row `a` (in `ActFormat::for_weights(t)`, same length).
pub fn vec_dot(t: QuantType, w: &[u8], a: &Q8Row) -> f32 {
    let bb = t.block_bytes();
    let mut sumf = 0f32;
    for (b, blk) in w.chunks_exact(bb).enumerate() {
        match t {
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q5_0 | QuantType::Q8_0 => {
                let y = &a.qs[32 * b..32 * b + 32];
                let mut sumi = 0i32;
                for (j, &q) in y.iter().enumerate() {
                    sumi += legacy_code(t, blk, j) * q as i32;
                }
                let dd = f16_at(blk, 0) * a.d[b];
                sumf += sumi as f32 * dd;
                if t == QuantType::Q4_1 {
                    sumf += f16_at(blk, 2) * a.s[b];
                }
            }
            QuantType::Q4_K => {
                let y = &a.qs[QK_K * b..QK_K * (b + 1)];
                let (mut isum, mut msum) = (0i32, 0i32);
                for sub in 0..8 {
                    let (sc, m) = q4k_scale_min(sub, &blk[4..16]);
                    let mut t = 0i32;
                    for l in 0..32 {
                        let e = 32 * sub + l;
                        let byte = blk[16 + 32 * (sub / 2) + l];
                        let q = if sub % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                        t += q as i32 * y[e] as i32;
                    }
                    isum += sc as i32 * t;
                    msum += m as i32 * (a.sums[16 * b + 2 * sub] + a.sums[16 * b + 2 * sub + 1]);
                }
                let dy = a.d[b];
                sumf += (f16_at(blk, 0) * dy) * isum as f32 - (f16_at(blk, 2) * dy) * msum as f32;
            }
            QuantType::Q6_K => {
                let y = &a.qs[QK_K * b..QK_K * (b + 1)];
                let mut isum = 0i32;
                for sub in 0..16 {
                    let sc = blk[192 + sub] as i8 as i32;
                    let mut t = 0i32;
                    for l in 0..16 {
                        let e = 16 * sub + l;
                        t += (q6k_value(blk, e) as i32 - 32) * y[e] as i32;
                    }
                    isum += sc * t;
                }
                sumf += (f16_at(blk, 208) * a.d[b]) * isum as f32;
            }
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => {
                unreachable!("vec_dot: float type")
            }
        }
    }
    sumf
}

/// The signed integer value `j` (0..32) of a legacy block (Q4_1: unsigned, the min is separate).
#[inline(always)]
fn legacy_code(t: QuantType, blk: &[u8], j: usize) -> i32 {
    match t {
        QuantType::Q4_0 => {
            let q = blk[2 + j % 16];
            (if j < 16 { q & 0x0F } else { q >> 4 }) as i32 - 8
        }
        QuantType::Q4_1 => {
            let q = blk[4 + j % 16];
            (if j < 16 { q & 0x0F } else { q >> 4 }) as i32
        }
        QuantType::Q5_0 => {
            let q = blk[6 + j % 16];
            let lo = if j < 16 { q & 0x0F } else { q >> 4 };
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            (lo as u32 | (((qh >> j) & 1) << 4)) as i32 - 16
        }
        _ => blk[2 + j] as i8 as i32,
    }
}

/// `y[m × n] = x[m × k] · Wᵀ` with `W` given as raw GGUF rows of type `t` (quantized), through
/// [`quantize_act`] and [`vec_dot`]: the oracle for the CPU backend's `QuantMatrix::matmul`.
pub fn matmul(t: QuantType, w: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let f = ActFormat::for_weights(t).expect("quantized type");
    let rb = t.row_bytes(k).expect("k is a multiple of the block");
    let mut y = vec![0f32; m * n];
    for i in 0..m {
        let a = quantize_act(f, &x[i * k..(i + 1) * k]);
        for j in 0..n {
            y[i * n + j] = vec_dot(t, &w[j * rb..(j + 1) * rb], &a);
        }
    }
    y
}
