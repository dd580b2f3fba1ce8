//! RGB pixels to a vision tower's input, as `Qwen2VLImageProcessor` (torchvision backend)
//! computes it: `smart_resize` + the uint8 antialiased bicubic resize, then rescale and
//! normalize in f32 (fused as the backend fuses them: mean and std scaled by
//! `1 / rescale_factor`, then `(x - mean) / std`), then the patch layout. Also the content hash
//! that keys the prefix cache by image. Decoding is in `decode`, the resize in `resize`.

use image::RgbImage;
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use super::config::ImageProcessorConfig;
use super::decode::{decode_with, ImageLimits};
use super::resize::{resize, smart_resize};
use crate::error::{Error, Result};

/// One image ready for the vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedImage {
    /// f32 [grid_t * grid_h * grid_w, 3 * temporal_patch_size * patch_size * patch_size]: one row
    /// per patch in the processor's order (blocks of `merge_size` x `merge_size` patches, block
    /// rows then block columns), each row `[channel][t][y][x]`, the image repeated over `t`.
    pub pixel_values: Vec<f32>,
    /// `[grid_t, grid_h, grid_w]` in patches (`grid_t` is 1 for an image): `image_grid_thw`.
    pub grid_thw: [usize; 3],
    /// SHA-256 of everything `pixel_values` is computed from (layout, the per-channel value
    /// table, the resized pixels): equal hashes mean equal pixel values.
    pub content_hash: [u8; 32],
}

impl PreparedImage {
    /// Number of patches (rows of `pixel_values`).
    pub fn n_patches(&self) -> usize {
        self.grid_thw.iter().product()
    }

    /// Number of language-model tokens the image becomes after the vision tower merges
    /// `merge_size` x `merge_size` patches into one: `grid_t * grid_h * grid_w / merge_size²`.
    pub fn merged_tokens(&self, merge_size: usize) -> usize {
        self.n_patches() / (merge_size * merge_size).max(1)
    }
}

/// Decodes `bytes` under `limits` (see [`super::decode::decode`]) and preprocesses the pixels
/// with `cfg` (see [`preprocess`]).
pub fn load(
    bytes: &[u8],
    limits: &ImageLimits,
    cfg: &ImageProcessorConfig,
) -> Result<PreparedImage> {
    let image = decode_with(bytes, limits, cfg.do_convert_rgb)?;
    preprocess(&image, cfg)
}

/// Resizes (when `do_resize`), rescales, normalizes and patches `image` as the reference
/// processor does; `pixel_values` equal transformers' bit for bit.
pub fn preprocess(image: &RgbImage, cfg: &ImageProcessorConfig) -> Result<PreparedImage> {
    cfg.validate()
        .map_err(|e| Error::InvalidImage(format!("processor settings: {e}")))?;
    let (h, w) = (image.height() as usize, image.width() as usize);
    let (rh, rw) = if cfg.do_resize {
        smart_resize(h, w, cfg.factor(), cfg.min_pixels, cfg.max_pixels)?
    } else {
        check_unresized(h, w, cfg.factor())?;
        (h, w)
    };
    let resized;
    let pixels = if (rh, rw) == (h, w) {
        image
    } else {
        resized = resize(image, rh, rw)?;
        &resized
    };
    let lut = value_table(cfg);
    let (p, m) = (cfg.patch_size, cfg.merge_size);
    let grid_thw = [1, rh / p, rw / p];
    let pixel_values = patchify(pixels.as_raw(), rw, grid_thw, cfg, &lut);
    let content_hash = content_hash(pixels, cfg, &lut);
    debug_assert_eq!(grid_thw[1] % m, 0);
    Ok(PreparedImage {
        pixel_values,
        grid_thw,
        content_hash,
    })
}

/// Refuses, when `do_resize` is off, an image whose sides are not multiples of `factor`
/// (the reference fails in its patch reshape).
pub(crate) fn check_unresized(height: usize, width: usize, factor: usize) -> Result<()> {
    if height == 0 || width == 0 || !height.is_multiple_of(factor) || !width.is_multiple_of(factor)
    {
        return Err(Error::InvalidImage(format!(
            "{height} x {width} pixels are not multiples of {factor} (patch_size * merge_size) \
             and do_resize is off"
        )));
    }
    Ok(())
}

/// f32 [3][256]: each channel's output for each byte value, computed with the reference's f32
/// operations (`mean * (1 / rescale_factor)` and `std * (1 / rescale_factor)` in f32, then
/// `(x - mean) / std`; or `x * rescale_factor`; or `(x - mean) / std`; or `x`).
fn value_table(cfg: &ImageProcessorConfig) -> [[f32; 256]; 3] {
    let inv = (1.0 / cfg.rescale_factor) as f32;
    let rf = cfg.rescale_factor as f32;
    let mut lut = [[0.0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        let (mean, std) = (cfg.image_mean[c] as f32, cfg.image_std[c] as f32);
        for (v, out) in table.iter_mut().enumerate() {
            let x = v as f32;
            *out = match (cfg.do_rescale, cfg.do_normalize) {
                (true, true) => (x - mean * inv) / (std * inv),
                (true, false) => x * rf,
                (false, true) => (x - mean) / std,
                (false, false) => x,
            };
        }
    }
    lut
}

/// The processor's `patchify`: u8 [h, w, 3] (`pixels`, rows of `width`) to f32 rows of
/// `patch_dim` in merge-block order, each `[c][t][py][px]`, values through `lut`.
fn patchify(
    pixels: &[u8],
    width: usize,
    grid_thw: [usize; 3],
    cfg: &ImageProcessorConfig,
    lut: &[[f32; 256]; 3],
) -> Vec<f32> {
    let (p, m, t) = (cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size);
    let [_, grid_h, grid_w] = grid_thw;
    let pp = p * p;
    let blocks_w = grid_w / m;
    let mut out = vec![0.0f32; grid_h * grid_w * cfg.patch_dim()];
    out.par_chunks_mut(cfg.patch_dim())
        .enumerate()
        .for_each(|(r, row)| {
            let (mw, mh) = (r % m, (r / m) % m);
            let block = r / (m * m);
            let (bw, bh) = (block % blocks_w, block / blocks_w);
            let (gy, gx) = (bh * m + mh, bw * m + mw);
            for (c, plane) in row.chunks_exact_mut(t * pp).enumerate() {
                let (first, repeats) = plane.split_at_mut(pp);
                for (py, line) in first.chunks_exact_mut(p).enumerate() {
                    let start = ((gy * p + py) * width + gx * p) * 3 + c;
                    let src = pixels[start..].iter().step_by(3);
                    for (o, &v) in line.iter_mut().zip(src) {
                        *o = lut[c][usize::from(v)];
                    }
                }
                for rep in repeats.chunks_exact_mut(pp) {
                    rep.copy_from_slice(first);
                }
            }
        });
    out
}

/// SHA-256 over the layout (patch, temporal patch, merge, resized height and width), the
/// value table and the resized pixels: the inputs `pixel_values` is a function of.
fn content_hash(pixels: &RgbImage, cfg: &ImageProcessorConfig, lut: &[[f32; 256]; 3]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"lattice.vision.pixel_values.v1");
    for n in [
        cfg.patch_size,
        cfg.temporal_patch_size,
        cfg.merge_size,
        pixels.height() as usize,
        pixels.width() as usize,
    ] {
        h.update((n as u64).to_le_bytes());
    }
    for v in lut.iter().flatten() {
        h.update(v.to_le_bytes());
    }
    h.update(pixels.as_raw());
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ImageProcessorConfig {
        ImageProcessorConfig {
            min_pixels: 32 * 32,
            max_pixels: 64 * 64 * 4,
            ..ImageProcessorConfig::default()
        }
    }

    #[test]
    fn layout_puts_merge_blocks_together() {
        // 64 x 64 image (no resize): 4 x 4 patches of 16, pixel (y, x) holds y in red, x in
        // green. Row 2 is block (0, 0), patch (mh 1, mw 0): grid (1, 0), its first pixel (16, 0).
        let img = RgbImage::from_fn(64, 64, |x, y| image::Rgb([y as u8, x as u8, 7]));
        let cfg = ImageProcessorConfig {
            do_rescale: false,
            do_normalize: false,
            ..small()
        };
        let out = preprocess(&img, &cfg).unwrap();
        assert_eq!(out.grid_thw, [1, 4, 4]);
        assert_eq!(out.merged_tokens(2), 4);
        let dim = cfg.patch_dim();
        let row = &out.pixel_values[2 * dim..3 * dim];
        assert_eq!((row[0], row[1], row[16]), (16.0, 16.0, 17.0)); // red: y
        assert_eq!(row[2 * 256], 0.0); // green (c 1, t 0): x
        assert_eq!(row[256], 16.0); // red repeated at t 1
        assert_eq!(row[4 * 256 + 5], 7.0); // blue
        let block1 = &out.pixel_values[4 * dim..5 * dim]; // block (0, 1): grid (0, 2)
        assert_eq!((block1[0], block1[512]), (0.0, 32.0));
    }

    #[test]
    fn fused_normalization_maps_the_ends_to_minus_one_and_one() {
        let lut = value_table(&ImageProcessorConfig::default());
        assert_eq!((lut[0][0], lut[1][255]), (-1.0, 1.0));
    }

    #[test]
    fn hash_follows_content_and_settings() {
        let img = RgbImage::from_fn(40, 30, |x, y| image::Rgb([x as u8, y as u8, 3]));
        let a = preprocess(&img, &small()).unwrap();
        let mut other = img.clone();
        other.get_pixel_mut(3, 3).0[0] ^= 1;
        let b = preprocess(&other, &small()).unwrap();
        let c = preprocess(
            &img,
            &ImageProcessorConfig {
                image_mean: [0.4; 3],
                ..small()
            },
        )
        .unwrap();
        assert_eq!(
            a.content_hash,
            preprocess(&img, &small()).unwrap().content_hash
        );
        assert_ne!(a.content_hash, b.content_hash);
        assert_ne!(a.content_hash, c.content_hash);
    }
}
