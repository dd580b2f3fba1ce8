//! On-the-fly quantization of activation rows, as llama.cpp's CPU backend does before an
//! integer dot product: Q8_0 blocks of 32 (for Q4_0, Q5_0 and Q8_0 weights), Q8_1 (for Q4_1)
//! and Q8_K super-blocks of 256 (for Q4_K and Q6_K).
//!
//! Q8_0 / Q8_1 follow ggml's x86 (AVX) quantizer, the one that runs on the CPUs we target:
//! `d = amax / 127` (stored as f16), `q = round_half_even(x * (127 / amax))`, and for Q8_1
//! `s = f16(d * Σq)`. Q8_K follows `quantize_row_q8_K_ref`: `iscale = -127 / x[argmax |x|]`,
//! `q = min(127, round_half_even(iscale * x))`, `d = 1 / iscale` (f32), sums per 16.
//!
//! `QActs` (crate-internal) is the kernel-facing form of `m` quantized rows: the codes plus,
//! per block, the float scale and the integer offset correction that the CPU backend's repacked
//! weight layout needs (weights are stored as unsigned codes `q + offset`, so
//! `Σ q_w q_a = Σ code · q_a − offset · Σ q_a`).

use super::blocks::{f16_round, QK_K};
use super::QuantType;

/// The activation format a weight type is multiplied with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Q8_0: blocks of 32, f16 scale.
    Q8_0,
    /// Q8_1: Q8_0 plus `s = d * Σq` (f16).
    Q8_1,
    /// Q8_K: blocks of 256, f32 scale, sums per 16.
    Q8K,
}

impl ActFormat {
    /// The format llama.cpp pairs with weights of type `t` (`None` for the float types).
    pub fn for_weights(t: QuantType) -> Option<ActFormat> {
        match t {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => Some(ActFormat::Q8_0),
            QuantType::Q4_1 => Some(ActFormat::Q8_1),
            QuantType::Q4_K | QuantType::Q6_K => Some(ActFormat::Q8K),
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => None,
        }
    }

    /// Values per block.
    pub fn block_len(self) -> usize {
        match self {
            ActFormat::Q8_0 | ActFormat::Q8_1 => 32,
            ActFormat::Q8K => QK_K,
        }
    }
}

/// One activation row quantized for a dot product: codes, per-block scale, and sums.
#[derive(Clone, Debug, Default)]
pub struct Q8Row {
    /// The codes, one per value.
    pub qs: Vec<i8>,
    /// Per block: the scale as the dot product uses it (f16-rounded for Q8_0/Q8_1).
    pub d: Vec<f32>,
    /// Q8_1 only: per block, `s = f16(d · Σq)` as f32.
    pub s: Vec<f32>,
    /// Integer sums of the codes: per 32 for Q8_0/Q8_1, per 16 for Q8_K (ggml's `bsums`).
    pub sums: Vec<i32>,
}

/// `round_half_even(v)` for `|v| < 2²²`, as ggml's `nearest_int`: adding 1.5 · 2²³ leaves the
/// integer in the low mantissa bits (the FP add rounds to nearest even). Vectorizes, unlike a
/// call to `roundevenf`.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The largest `|v|` of `x` (a multiple of 8 values), NaN ignored, 0 for none: in eight lanes
/// then across them, so that it vectorizes (a running maximum does not: the compiler keeps a
/// float reduction in order). The maximum of a set does not depend on the order it is taken in.
#[inline(always)]
fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    for c in x.chunks_exact(8) {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    lanes.iter().fold(0f32, |m, &v| m.max(v))
}

/// [`abs_max`] of `x` and the first value of that magnitude, with its sign (0 for none).
#[inline(always)]
fn signed_abs_max(x: &[f32]) -> (f32, f32) {
    let amax = abs_max(x);
    (
        amax,
        x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0),
    )
}

/// Quantizes one block of 32 as Q8_0 / Q8_1 (x86 flavour) into `q`; returns the unrounded
/// scale `d` and `Σq`.
#[inline(always)]
fn q8_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let (x, q) = (&x[..32], &mut q[..32]);
    let amax = abs_max(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (qj, v) in q.iter_mut().zip(x) {
        let r = nearest_int(v * id);
        *qj = r as i8;
        sum += r;
    }
    (d, sum)
}

/// Quantizes one super-block of 256 as Q8_K into `q` and its 16 sums into `sums`; returns `d`.
#[inline(always)]
fn q8k_block(x: &[f32], q: &mut [i8], sums: &mut [i32]) -> f32 {
    let (x, q) = (&x[..QK_K], &mut q[..QK_K]);
    let (amax, max) = signed_abs_max(x);
    if amax == 0.0 {
        q.fill(0);
        sums[..QK_K / 16].fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (qj, v) in q.iter_mut().zip(x) {
        *qj = nearest_int(iscale * v).min(127) as i8;
    }
    for (s, qs) in sums.iter_mut().zip(q.chunks_exact(16)) {
        *s = qs.iter().map(|&v| v as i32).sum();
    }
    1.0 / iscale
}

/// Quantizes one activation row (`x.len()` a multiple of the format's block) as `f`.
pub fn quantize_act(f: ActFormat, x: &[f32]) -> Q8Row {
    let nb = x.len() / f.block_len();
    let mut r = Q8Row {
        qs: vec![0; x.len()],
        d: vec![0.0; nb],
        s: Vec::new(),
        sums: Vec::new(),
    };
    match f {
        ActFormat::Q8_0 | ActFormat::Q8_1 => {
            for (b, (xb, qb)) in x
                .chunks_exact(32)
                .zip(r.qs.chunks_exact_mut(32))
                .enumerate()
            {
                let (d, sum) = q8_block(xb, qb);
                r.d[b] = f16_round(d);
                r.sums.push(sum);
                if f == ActFormat::Q8_1 {
                    r.s.push(f16_round(d * sum as f32));
                }
            }
        }
        ActFormat::Q8K => {
            r.sums = vec![0; nb * 16];
            let blocks = x.chunks_exact(QK_K).zip(r.qs.chunks_exact_mut(QK_K));
            for (b, (xb, qb)) in blocks.enumerate() {
                r.d[b] = q8k_block(xb, qb, &mut r.sums[16 * b..16 * b + 16]);
            }
        }
    }
    r
}

/// `m` activation rows quantized for weights of one type, in the form the kernels read.
#[derive(Clone, Debug, Default)]
pub(crate) struct QActs {
    /// Rows.
    pub(crate) m: usize,
    /// Values per row.
    pub(crate) k: usize,
    /// Codes, `m × k`.
    pub(crate) qs: Vec<i8>,
    /// Scales, `m × (k / block)`.
    pub(crate) d: Vec<f32>,
    /// Q4_1 weights: `s` per block of 32 (`m × k/32`); empty otherwise.
    pub(crate) s: Vec<f32>,
    /// Integer corrections, `m × corr_per_row` (see [`QActs::corr_per_row`]).
    pub(crate) corr: Vec<i32>,
    /// Entries of `corr` per row.
    pub(crate) corr_per_row: usize,
}

impl QActs {
    /// Zeroed storage for `m` rows of `k` values quantized for weights of type `t` (a quantized
    /// type), which [`quantize_act_row`] fills row by row.
    ///
    /// `corr` holds, per row: Q4_0 / Q5_0 / Q8_0: `-offset · Σq` per block of 32 (offset 8, 16,
    /// 128: the weight codes are stored unsigned); Q6_K: `-32 · Σq` per 16; Q4_K: per
    /// super-block, the four pairs of sums per 32 packed as two i16 in one i32 (low half the
    /// even sub-block); Q4_1: nothing.
    pub(crate) fn zeroed(t: QuantType, m: usize, k: usize) -> QActs {
        let f = ActFormat::for_weights(t).expect("quantized type");
        let nb = k / f.block_len();
        let corr_per_row = match t {
            QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => nb,
            QuantType::Q6_K => nb * 16,
            QuantType::Q4_K => nb * 4,
            _ => 0,
        };
        QActs {
            m,
            k,
            qs: vec![0; m * k],
            d: vec![0.0; m * nb],
            s: vec![0.0; if f == ActFormat::Q8_1 { m * nb } else { 0 }],
            corr: vec![0; m * corr_per_row],
            corr_per_row,
        }
    }

    /// Values of `d` (and of `s`, when it is not empty) per row.
    pub(crate) fn scales_per_row(&self) -> usize {
        self.d.len().checked_div(self.m).unwrap_or(0)
    }
}

/// Quantizes one row for weights of type `t` into its slices of a [`QActs`] (the CPU backend
/// fills the rows of a [`QActs`] with it, in parallel: `backend::cpu::qdot`).
pub(crate) fn quantize_act_row(
    t: QuantType,
    x: &[f32],
    qs: &mut [i8],
    d: &mut [f32],
    s: &mut [f32],
    corr: &mut [i32],
) {
    match t {
        QuantType::Q4_K | QuantType::Q6_K => {
            let mut sums = [0i32; 16];
            for (b, (xb, qb)) in x
                .chunks_exact(QK_K)
                .zip(qs.chunks_exact_mut(QK_K))
                .enumerate()
            {
                d[b] = q8k_block(xb, qb, &mut sums);
                if t == QuantType::Q6_K {
                    for (c, s) in corr[16 * b..16 * b + 16].iter_mut().zip(&sums) {
                        *c = -32 * s;
                    }
                } else {
                    for p in 0..4 {
                        let lo = (sums[4 * p] + sums[4 * p + 1]) as i16 as u16 as u32;
                        let hi = (sums[4 * p + 2] + sums[4 * p + 3]) as i16 as u16 as u32;
                        corr[4 * b + p] = (lo | (hi << 16)) as i32;
                    }
                }
            }
        }
        _ => {
            let off = match t {
                QuantType::Q4_0 => 8,
                QuantType::Q5_0 => 16,
                QuantType::Q8_0 => 128,
                _ => 0,
            };
            for (b, (xb, qb)) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)).enumerate() {
                let (dd, sum) = q8_block(xb, qb);
                d[b] = f16_round(dd);
                if t == QuantType::Q4_1 {
                    s[b] = f16_round(dd * sum as f32);
                } else {
                    corr[b] = -off * sum;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running-maximum forms the vectorizable ones replaced.
    fn q8_block_in_order(x: &[f32], q: &mut [i8]) -> (f32, i32) {
        let mut amax = 0f32;
        for v in &x[..32] {
            let a = v.abs();
            amax = if a > amax { a } else { amax };
        }
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0;
        for (qj, v) in q.iter_mut().zip(&x[..32]) {
            let r = nearest_int(v * id);
            *qj = r as i8;
            sum += r;
        }
        (amax / 127.0, sum)
    }

    fn q8k_max_in_order(x: &[f32]) -> (f32, f32) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in &x[..QK_K] {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        (amax, max)
    }

    #[test]
    fn blocks_equal_the_running_maximum_forms_bit_for_bit() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 3.0
        };
        for case in 0..200 {
            let mut x: Vec<f32> = (0..QK_K).map(|_| next()).collect();
            match case % 6 {
                // Ties of magnitude with both signs, the negative one first.
                0 => {
                    x[7] = -2.5;
                    x[100] = 2.5;
                    x.iter_mut()
                        .filter(|v| v.abs() > 2.5)
                        .for_each(|v| *v = 0.5);
                }
                1 => x.fill(0.0),
                2 => {
                    x[3] = f32::NAN;
                    x[200] = f32::NAN;
                }
                3 => x.iter_mut().step_by(2).for_each(|v| *v = -0.0),
                4 => x.fill(f32::NAN),
                _ => {}
            }
            for b in 0..QK_K / 32 {
                let (mut q1, mut q2) = ([0i8; 32], [0i8; 32]);
                let xb = &x[32 * b..32 * b + 32];
                let (d1, s1) = q8_block(xb, &mut q1);
                let (d2, s2) = q8_block_in_order(xb, &mut q2);
                assert_eq!(
                    (d1.to_bits(), s1, q1),
                    (d2.to_bits(), s2, q2),
                    "case {case} block {b}"
                );
            }
            let (amax, max) = signed_abs_max(&x);
            let (a2, m2) = q8k_max_in_order(&x);
            assert_eq!(
                (amax.to_bits(), max.to_bits()),
                (a2.to_bits(), m2.to_bits()),
                "case {case}"
            );
        }
    }
}
