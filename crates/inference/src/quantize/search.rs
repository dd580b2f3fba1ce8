//! Q4_0 / Q4_1 blocks with searched parameters: each block's scale (Q4_0: `d = max / −8 · f`)
//! or range (Q4_1: `[min + a·r, max − b·r]`, `r = max − min`) chosen on a grid for the least
//! squared error, measured with the f16-rounded values the block stores. The layout is ggml's
//! (`quant::quantize_row`). GPTQ (`super::gptq`) picks each block's parameters the same way and
//! then rounds value by value with them.

use half::f16;

use crate::quant::QuantType;

/// Values per block.
pub(super) const BLOCK: usize = 32;

/// A Q4_0 or Q4_1 block's stored parameters, as the f32 values the kernels decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Q4Params {
    /// Q4_1 when true (`q · d + m`), else Q4_0 (`(q − 8) · d`).
    asym: bool,
    d: f32,
    m: f32,
}

impl Q4Params {
    /// The parameters of least squared error for the block `x` (32 values).
    pub(super) fn search(qt: QuantType, x: &[f32]) -> Self {
        debug_assert_eq!(x.len(), BLOCK);
        let sq_err = |p: &Q4Params| x.iter().map(|&v| (v - p.code(v).1).powi(2)).sum::<f32>();
        let mut best = (f32::INFINITY, Self::new(qt, 0.0, 0.0));
        let mut consider = |p: Q4Params| {
            let e = sq_err(&p);
            if e < best.0 {
                best = (e, p);
            }
        };
        if qt == QuantType::Q4_0 {
            let max = x
                .iter()
                .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
            for step in 0..24 {
                consider(Self::new(
                    qt,
                    max / -8.0 * (1.0 - 0.0125 * step as f32),
                    0.0,
                ));
            }
        } else {
            let lo = x.iter().copied().fold(f32::MAX, f32::min);
            let hi = x.iter().copied().fold(-f32::MAX, f32::max);
            let r = hi - lo;
            for a in 0..6 {
                for b in 0..6 {
                    let (mn, mx) = (lo + r * 0.02 * a as f32, hi - r * 0.02 * b as f32);
                    consider(Self::new(qt, (mx - mn) / 15.0, mn));
                }
            }
        }
        best.1
    }

    /// Parameters `d` and `m` (Q4_1 only) rounded to f16 as stored.
    fn new(qt: QuantType, d: f32, m: f32) -> Self {
        let asym = qt == QuantType::Q4_1;
        Self {
            asym,
            d: f16::from_f32(d).to_f32(),
            m: if asym { f16::from_f32(m).to_f32() } else { 0.0 },
        }
    }

    /// The 4-bit code nearest to `v` and the value it decodes to.
    pub(super) fn code(&self, v: f32) -> (u8, f32) {
        let id = if self.d != 0.0 { 1.0 / self.d } else { 0.0 };
        if self.asym {
            let q = ((v - self.m) * id).round().clamp(0.0, 15.0);
            (q as u8, q * self.d + self.m)
        } else {
            let q = (v * id).round().clamp(-8.0, 7.0);
            ((q + 8.0) as u8, q * self.d)
        }
    }

    /// Writes the block (`codes`: 32 codes) into `dst` (18 bytes for Q4_0, 20 for Q4_1).
    pub(super) fn write(&self, codes: &[u8], dst: &mut [u8]) {
        dst[..2].copy_from_slice(&f16::from_f32(self.d).to_le_bytes());
        let qs = if self.asym {
            dst[2..4].copy_from_slice(&f16::from_f32(self.m).to_le_bytes());
            &mut dst[4..]
        } else {
            &mut dst[2..]
        };
        for j in 0..16 {
            qs[j] = codes[j] | (codes[j + 16] << 4);
        }
    }
}

/// Q4_0 / Q4_1 blocks of the row `x` into `dst`, each with searched parameters.
pub(super) fn quantize_row_searched(qt: QuantType, x: &[f32], dst: &mut [u8]) {
    let mut codes = [0u8; BLOCK];
    for (g, blk) in x
        .chunks_exact(BLOCK)
        .zip(dst.chunks_exact_mut(qt.block_bytes()))
    {
        let p = Q4Params::search(qt, g);
        for (c, &v) in codes.iter_mut().zip(g) {
            *c = p.code(v).0;
        }
        p.write(&codes, blk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize_row, quantize_row};

    #[test]
    fn searched_blocks_are_never_worse_than_nearest() {
        let x: Vec<f32> = (0..32 * 64)
            .map(|i| ((i as f32 * 0.731).sin() * 3.0).powi(3) * 0.01)
            .collect();
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let rb = qt.row_bytes(x.len()).unwrap();
            let (mut near, mut mse) = (vec![0u8; rb], vec![0u8; rb]);
            quantize_row(qt, &x, &mut near).unwrap();
            quantize_row_searched(qt, &x, &mut mse);
            let err = |b: &[u8]| {
                let mut y = vec![0f32; x.len()];
                dequantize_row(qt, b, &mut y).unwrap();
                x.iter()
                    .zip(&y)
                    .map(|(a, b)| (a - b) * (a - b))
                    .sum::<f32>()
            };
            assert!(
                err(&mse) < err(&near),
                "{}: {} vs {}",
                qt.name(),
                err(&mse),
                err(&near)
            );
        }
    }

    #[test]
    fn codes_decode_as_the_kernels_decode() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 * 1.37).cos() - 0.2).collect();
        for qt in [QuantType::Q4_0, QuantType::Q4_1] {
            let p = Q4Params::search(qt, &x);
            let mut codes = [0u8; 32];
            let mut mine = [0f32; 32];
            for i in 0..32 {
                (codes[i], mine[i]) = p.code(x[i]);
            }
            let mut blk = vec![0u8; qt.block_bytes()];
            p.write(&codes, &mut blk);
            let mut theirs = [0f32; 32];
            dequantize_row(qt, &blk, &mut theirs).unwrap();
            assert_eq!(mine, theirs, "{}", qt.name());
        }
    }
}
