//! The resize of the reference processor: `smart_resize` (the target size) and torchvision's
//! `resize(uint8, BICUBIC, antialias=True)` on the CPU, which runs ATen's uint8 antialiased
//! bicubic kernel (`_upsample_bicubic2d_aa`, `UpSampleKernel.cpp`). That kernel is PIL's
//! fixed-point resampler: per axis, Keys cubic weights (a = -0.5) over a support of 2 input
//! pixels (2 x scale when shrinking), normalized in f64, then turned into int16 with a
//! precision chosen from the largest weight; a horizontal pass, its output rounded and clamped
//! to uint8, then a vertical pass over it. Both passes here are exact integer arithmetic, so
//! the result equals torch's bit for bit. This module does not decode or normalize.

use image::RgbImage;
use rayon::prelude::*;

use crate::error::{Error, Result};

/// The largest aspect ratio (long side / short side) `smart_resize` accepts.
const MAX_ASPECT: f64 = 200.0;
/// Bytes per pixel of an RGB image.
const RGB: usize = 3;

/// The size an image of `height` x `width` is resized to, exactly as transformers'
/// `smart_resize`: both sides multiples of `factor` (`patch_size * merge_size`), the pixel count
/// within `[min_pixels, max_pixels]` where the rounding allows, the aspect ratio kept as nearly
/// as possible (Python's `round`, which rounds halves to even). An aspect ratio over 200 is
/// refused, as is a size that rounds to zero.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize)> {
    if height == 0 || width == 0 || factor == 0 {
        return Err(Error::InvalidImage(format!(
            "cannot resize {height} x {width} pixels to multiples of {factor}"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > MAX_ASPECT {
        return Err(Error::InvalidImage(format!(
            "{height} x {width} pixels: aspect ratio {ratio} is over {MAX_ASPECT}, which the processor refuses"
        )));
    }
    let pixels = height as f64 * width as f64;
    let mut h_bar = (h / f).round_ties_even() * f;
    let mut w_bar = (w / f).round_ties_even() * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (pixels / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / pixels).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    // Every value above is an integer below 2^53 for any image that fits in memory.
    let (rh, rw) = (h_bar as usize, w_bar as usize);
    if rh == 0 || rw == 0 {
        return Err(Error::InvalidImage(format!(
            "{height} x {width} pixels resize to {rh} x {rw} (min_pixels {min_pixels})"
        )));
    }
    Ok((rh, rw))
}

/// The int16 taps of one axis: for each output index, the first input index, the number of
/// taps, and `taps` weights (zero past the count) scaled by `2^precision`.
#[derive(Debug)]
struct AxisWeights {
    starts: Vec<usize>,
    counts: Vec<usize>,
    // i32 holding int16 values [n_out, taps]
    weights: Vec<i32>,
    taps: usize,
    precision: u32,
}

/// Keys' cubic convolution kernel with a = -0.5 (ATen `HelperInterpCubic::aa_filter`,
/// `cubic_convolution1` / `cubic_convolution2`, in this order of operations).
fn cubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

/// ATen's `_compute_index_ranges_int16_weights` for the antialiased bicubic filter, with
/// `align_corners = false` and no explicit scale (torchvision passes the output size).
fn axis_weights(n_in: usize, n_out: usize) -> AxisWeights {
    let scale = n_in as f64 / n_out as f64;
    let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
    let taps = support.ceil() as usize * 2 + 1;
    let invscale = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
    let mut starts = Vec::with_capacity(n_out);
    let mut counts = Vec::with_capacity(n_out);
    let mut float_weights = vec![0.0f64; n_out * taps];
    let mut wt_max = 0.0f64;
    for (i, ws) in float_weights.chunks_mut(taps).enumerate() {
        let center = scale * (i as f64 + 0.5);
        // C casts truncate toward zero; both bounds are then clipped to the input.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(n_in as i64);
        let count = (xmax - xmin).clamp(0, taps as i64) as usize;
        let mut total = 0.0;
        for (j, w) in ws[..count].iter_mut().enumerate() {
            *w = cubic(((j as i64 + xmin) as f64 - center + 0.5) * invscale);
            total += *w;
        }
        if total != 0.0 {
            for w in &mut ws[..count] {
                *w /= total;
                wt_max = wt_max.max(*w);
            }
        }
        starts.push(xmin as usize);
        counts.push(count);
    }
    let mut precision = 0u32;
    while precision < 22 {
        let next = (0.5 + wt_max * f64::from(1u32 << (precision + 1))) as i64;
        if next >= 1 << 15 {
            break;
        }
        precision += 1;
    }
    let unit = f64::from(1u32 << precision);
    let weights = float_weights
        .iter()
        .map(|&w| {
            let v = w * unit;
            if v < 0.0 {
                (-0.5 + v) as i32
            } else {
                (0.5 + v) as i32
            }
        })
        .collect();
    AxisWeights {
        starts,
        counts,
        weights,
        taps,
        precision,
    }
}

impl AxisWeights {
    /// The rounding term added before the shift (half of one unit of the result).
    fn half(&self) -> i32 {
        if self.precision == 0 {
            0
        } else {
            1 << (self.precision - 1)
        }
    }

    /// Output `i`'s first input index and its weights.
    fn taps_of(&self, i: usize) -> (usize, &[i32]) {
        let k = &self.weights[i * self.taps..][..self.counts[i]];
        (self.starts[i], k)
    }
}

/// `(sum >> precision)` clamped to a byte, as the kernel's saturating packs do.
#[inline]
fn to_u8(sum: i32, precision: u32) -> u8 {
    (sum >> precision).clamp(0, 255) as u8
}

/// Resamples each row of `src` (u8 [n_rows, n_in, 3]) to `dst` (u8 [n_rows, n_out, 3]).
fn horizontal(src: &[u8], n_in: usize, dst: &mut [u8], n_out: usize, ax: &AxisWeights) {
    let half = ax.half();
    dst.par_chunks_mut(n_out * RGB)
        .zip(src.par_chunks(n_in * RGB))
        .for_each(|(out, row)| {
            for (x, px) in out.chunks_exact_mut(RGB).enumerate() {
                let (start, k) = ax.taps_of(x);
                let input = &row[start * RGB..(start + k.len()) * RGB];
                let (mut r, mut g, mut b) = (half, half, half);
                for (&w, p) in k.iter().zip(input.chunks_exact(RGB)) {
                    r += w * i32::from(p[0]);
                    g += w * i32::from(p[1]);
                    b += w * i32::from(p[2]);
                }
                px[0] = to_u8(r, ax.precision);
                px[1] = to_u8(g, ax.precision);
                px[2] = to_u8(b, ax.precision);
            }
        });
}

/// Resamples the columns of `src` (u8 [n_in, row_len]) to `dst` (u8 [n_out, row_len]).
fn vertical(src: &[u8], row_len: usize, dst: &mut [u8], ax: &AxisWeights) {
    let half = ax.half();
    dst.par_chunks_mut(row_len).enumerate().for_each_init(
        || vec![0i32; row_len],
        |acc, (y, out)| {
            let (start, k) = ax.taps_of(y);
            acc.fill(half);
            for (j, &w) in k.iter().enumerate() {
                let row = &src[(start + j) * row_len..][..row_len];
                for (a, &p) in acc.iter_mut().zip(row) {
                    *a += w * i32::from(p);
                }
            }
            for (o, &a) in out.iter_mut().zip(acc.iter()) {
                *o = to_u8(a, ax.precision);
            }
        },
    );
}

/// Resizes `image` to `height` x `width` as torchvision's uint8 `resize(..., BICUBIC,
/// antialias=True)` does on the CPU: horizontal pass first (skipped when the width is
/// unchanged), rounded and clamped to uint8, then the vertical pass (skipped when the height is
/// unchanged). The same size returns a copy.
pub fn resize(image: &RgbImage, height: usize, width: usize) -> Result<RgbImage> {
    let (w_in, h_in) = (image.width() as usize, image.height() as usize);
    if height == 0 || width == 0 || w_in == 0 || h_in == 0 {
        return Err(Error::InvalidImage(format!(
            "cannot resize {h_in} x {w_in} pixels to {height} x {width}"
        )));
    }
    let (Ok(w32), Ok(h32)) = (u32::try_from(width), u32::try_from(height)) else {
        return Err(Error::InvalidImage(format!(
            "resize target {height} x {width} is too large"
        )));
    };
    let mut data = std::borrow::Cow::Borrowed(image.as_raw().as_slice());
    if width != w_in {
        let ax = axis_weights(w_in, width);
        let mut out = vec![0u8; h_in * width * RGB];
        horizontal(&data, w_in, &mut out, width, &ax);
        data = out.into();
    }
    if height != h_in {
        let ax = axis_weights(h_in, height);
        let mut out = vec![0u8; height * width * RGB];
        vertical(&data, width * RGB, &mut out, &ax);
        data = out.into();
    }
    Ok(RgbImage::from_raw(w32, h32, data.into_owned())
        .expect("the buffer holds height * width RGB pixels"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_matches_python_on_known_values() {
        // Values from transformers' smart_resize.
        assert_eq!(smart_resize(67, 101, 32, 1024, 16384).unwrap(), (64, 96));
        assert_eq!(smart_resize(48, 80, 32, 1024, 1 << 20).unwrap(), (64, 64));
        assert_eq!(smart_resize(9, 12, 32, 1024, 16384).unwrap(), (32, 64));
        assert!(smart_resize(1, 201, 32, 1024, 16384).is_err());
        assert!(smart_resize(1, 200, 32, 1024, 16384).is_ok());
    }

    #[test]
    fn identity_axis_is_exact() {
        let ax = axis_weights(7, 7);
        for i in 0..7 {
            let (start, k) = ax.taps_of(i);
            let centre: Vec<i32> = k.iter().copied().filter(|&w| w != 0).collect();
            assert_eq!(centre, vec![1 << ax.precision], "output {i} from {start}");
        }
    }
}
