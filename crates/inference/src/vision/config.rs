//! The image processor's settings: a model folder's `preprocessor_config.json` read the way
//! transformers' `Qwen2VLImageProcessor` reads it (the processor of Qwen2-VL, Qwen3-VL and
//! Qwen3.5). Keys the file leaves out take that class's defaults; the legacy `min_pixels` /
//! `max_pixels` keys override `size`. This module only parses and validates; the pixels are
//! handled in `resize` and `preprocess`.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// OpenAI CLIP's per-channel mean: `Qwen2VLImageProcessor`'s default `image_mean`.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP's per-channel standard deviation: the default `image_std`.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// The largest `patch_size * merge_size` accepted (keeps every size product far from overflow).
const MAX_FACTOR: usize = 1 << 12;
/// The largest `temporal_patch_size` accepted.
const MAX_TEMPORAL: usize = 64;

/// How images become `pixel_values` for a vision tower: the fields of `preprocessor_config.json`
/// that `Qwen2VLImageProcessor` honours.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessorConfig {
    /// Side of a square patch in pixels (`patch_size`).
    pub patch_size: usize,
    /// Frames per patch; a still image is repeated this many times (`temporal_patch_size`).
    pub temporal_patch_size: usize,
    /// Patches merged into one language-model token per side (`merge_size`).
    pub merge_size: usize,
    /// Fewest pixels after the resize (`size.shortest_edge`, or the legacy `min_pixels`).
    pub min_pixels: usize,
    /// Most pixels after the resize (`size.longest_edge`, or the legacy `max_pixels`).
    pub max_pixels: usize,
    /// Per-channel mean (RGB) subtracted after rescaling (`image_mean`).
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation (RGB) divided by (`image_std`).
    pub image_std: [f64; 3],
    /// Factor from 0..=255 to the model's range (`rescale_factor`, 1/255).
    pub rescale_factor: f64,
    /// Whether the image is resized to `smart_resize`'s size (`do_resize`); when off, its
    /// sides must already be multiples of `patch_size * merge_size`.
    pub do_resize: bool,
    /// Whether pixels are multiplied by `rescale_factor` (`do_rescale`).
    pub do_rescale: bool,
    /// Whether pixels are normalized by `image_mean` / `image_std` (`do_normalize`).
    pub do_normalize: bool,
    /// Whether the loader composites a PNG's transparent colour key onto white, as the
    /// processor's `convert_to_rgb` does (`do_convert_rgb`).
    pub do_convert_rgb: bool,
}

/// The values Qwen3-VL and Qwen3.5 checkpoints ship in `preprocessor_config.json`: patch 16,
/// merge 2, temporal patch 2, mean = std = 0.5, between 65,536 and 16,777,216 pixels.
impl Default for ImageProcessorConfig {
    fn default() -> Self {
        Self {
            patch_size: 16,
            temporal_patch_size: 2,
            merge_size: 2,
            min_pixels: 65_536,
            max_pixels: 16_777_216,
            image_mean: [0.5; 3],
            image_std: [0.5; 3],
            rescale_factor: 1.0 / 255.0,
            do_resize: true,
            do_rescale: true,
            do_normalize: true,
            do_convert_rgb: true,
        }
    }
}

impl ImageProcessorConfig {
    /// `Qwen2VLImageProcessor`'s class defaults: what a `preprocessor_config.json` without any
    /// of the keys gets (patch 14, CLIP mean / std, 56*56 to 28*28*1280 pixels).
    pub fn transformers_defaults() -> Self {
        Self {
            patch_size: 14,
            min_pixels: 56 * 56,
            max_pixels: 28 * 28 * 1280,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            ..Self::default()
        }
    }

    /// Reads `dir/preprocessor_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("preprocessor_config.json");
        let text = std::fs::read(&path).map_err(|e| Error::InvalidConfig {
            path: path.clone(),
            reason: if e.kind() == std::io::ErrorKind::NotFound {
                "missing: a vision model needs its preprocessor_config.json".into()
            } else {
                format!("cannot read: {e}")
            },
        })?;
        let value: Value = serde_json::from_slice(&text).map_err(|e| Error::InvalidConfig {
            path: path.clone(),
            reason: format!("not JSON: {e}"),
        })?;
        Self::from_json(&value, &path)
    }

    /// Reads the parsed contents of a `preprocessor_config.json` (`path` names it in errors).
    /// Missing or `null` keys take `Qwen2VLImageProcessor`'s class defaults.
    pub fn from_json(value: &Value, path: &Path) -> Result<Self> {
        let bad = |reason: String| Error::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        let obj = value
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let get = |key: &str| obj.get(key).filter(|v| !v.is_null());
        let d = Self::transformers_defaults();
        let count = |key: &str, default: usize| -> Result<usize> {
            match get(key) {
                None => Ok(default),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer, got {v}"))),
            }
        };
        let flag = |key: &str| -> Result<bool> {
            match get(key) {
                None => Ok(true),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| bad(format!("`{key}` must be true or false, got {v}"))),
            }
        };
        let triple = |key: &str, default: [f64; 3]| -> Result<[f64; 3]> {
            let Some(v) = get(key) else {
                return Ok(default);
            };
            if let Some(x) = v.as_f64() {
                return Ok([x; 3]);
            }
            let items: Option<Vec<f64>> = v
                .as_array()
                .map(|a| a.iter().map(Value::as_f64).collect())
                .unwrap_or(None);
            match items.as_deref() {
                Some(&[a, b, c]) => Ok([a, b, c]),
                _ => Err(bad(format!(
                    "`{key}` must be a number or a list of 3 numbers, got {v}"
                ))),
            }
        };

        let (mut min_pixels, mut max_pixels) = (d.min_pixels, d.max_pixels);
        if let Some(size) = get("size") {
            let size = size
                .as_object()
                .ok_or_else(|| bad(format!("`size` must be an object, got {size}")))?;
            let edge = |keys: [&'static str; 2]| {
                keys.iter()
                    .find_map(|k| size.get(*k).filter(|v| !v.is_null()).map(|v| (*k, v)))
            };
            for (slot, keys) in [
                (&mut min_pixels, ["shortest_edge", "min_pixels"]),
                (&mut max_pixels, ["longest_edge", "max_pixels"]),
            ] {
                if let Some((k, v)) = edge(keys) {
                    *slot = v
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| bad(format!("`size.{k}` must be an integer, got {v}")))?;
                }
            }
            let has_legacy = get("min_pixels").is_some() && get("max_pixels").is_some();
            if !has_legacy
                && (edge(["shortest_edge", "min_pixels"]).is_none()
                    || edge(["longest_edge", "max_pixels"]).is_none())
            {
                return Err(bad(
                    "`size` must hold `shortest_edge` and `longest_edge` (pixel counts)".into(),
                ));
            }
        }
        min_pixels = count("min_pixels", min_pixels)?;
        max_pixels = count("max_pixels", max_pixels)?;

        if let Some(v) = get("resample") {
            if v.as_u64() != Some(3) {
                return Err(bad(format!(
                    "`resample` {v} is not bicubic (3), the only resize implemented"
                )));
            }
        }
        let rescale_factor = match get("rescale_factor") {
            None => d.rescale_factor,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| bad(format!("`rescale_factor` must be a number, got {v}")))?,
        };
        let cfg = Self {
            patch_size: count("patch_size", d.patch_size)?,
            temporal_patch_size: count("temporal_patch_size", d.temporal_patch_size)?,
            merge_size: count("merge_size", d.merge_size)?,
            min_pixels,
            max_pixels,
            image_mean: triple("image_mean", d.image_mean)?,
            image_std: triple("image_std", d.image_std)?,
            rescale_factor,
            do_resize: flag("do_resize")?,
            do_rescale: flag("do_rescale")?,
            do_normalize: flag("do_normalize")?,
            do_convert_rgb: flag("do_convert_rgb")?,
        };
        cfg.validate().map_err(bad)?;
        Ok(cfg)
    }

    /// Checks the values a processor run relies on (sizes in range, finite non-zero divisors).
    pub fn validate(&self) -> std::result::Result<(), String> {
        for (name, v) in [
            ("patch_size", self.patch_size),
            ("merge_size", self.merge_size),
            ("temporal_patch_size", self.temporal_patch_size),
        ] {
            if v == 0 {
                return Err(format!("`{name}` must be at least 1"));
            }
        }
        if self.patch_size.saturating_mul(self.merge_size) > MAX_FACTOR {
            return Err(format!(
                "`patch_size` * `merge_size` = {} is over {MAX_FACTOR}",
                self.patch_size.saturating_mul(self.merge_size)
            ));
        }
        if self.temporal_patch_size > MAX_TEMPORAL {
            return Err(format!(
                "`temporal_patch_size` {} is over {MAX_TEMPORAL}",
                self.temporal_patch_size
            ));
        }
        if self.max_pixels == 0 {
            return Err("`size.longest_edge` (max_pixels) must be at least 1".into());
        }
        if !(self.rescale_factor.is_finite() && self.rescale_factor > 0.0) {
            return Err(format!(
                "`rescale_factor` must be a positive number, got {}",
                self.rescale_factor
            ));
        }
        if self.image_mean.iter().any(|m| !m.is_finite()) {
            return Err(format!("`image_mean` {:?} is not finite", self.image_mean));
        }
        if self.image_std.iter().any(|s| !s.is_finite() || *s == 0.0) {
            return Err(format!(
                "`image_std` {:?} must be finite and non-zero",
                self.image_std
            ));
        }
        Ok(())
    }

    /// The side multiple every resized image has: `patch_size * merge_size`.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// Length of one row of `pixel_values`: `3 * temporal_patch_size * patch_size²`.
    pub fn patch_dim(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// `[1, grid_h, grid_w]` for an image of `height` x `width` pixels without looking at its
    /// pixels (what `get_number_of_image_patches` computes): the resized size in patches.
    pub fn grid_thw(&self, height: usize, width: usize) -> Result<[usize; 3]> {
        let (h, w) = if self.do_resize {
            super::resize::smart_resize(
                height,
                width,
                self.factor(),
                self.min_pixels,
                self.max_pixels,
            )?
        } else {
            super::preprocess::check_unresized(height, width, self.factor())?;
            (height, width)
        };
        Ok([1, h / self.patch_size, w / self.patch_size])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ImageProcessorConfig> {
        ImageProcessorConfig::from_json(&v, Path::new("preprocessor_config.json"))
    }

    #[test]
    fn checkpoint_file_equals_default() {
        let cfg = parse(json!({
            "size": {"longest_edge": 16777216, "shortest_edge": 65536},
            "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast"
        }))
        .unwrap();
        assert_eq!(cfg, ImageProcessorConfig::default());
    }

    #[test]
    fn missing_keys_take_class_defaults_and_legacy_keys_override_size() {
        assert_eq!(
            parse(json!({})).unwrap(),
            ImageProcessorConfig::transformers_defaults()
        );
        let cfg = parse(json!({
            "size": {"min_pixels": 1, "max_pixels": 2}, "min_pixels": 3136, "max_pixels": 12845056,
            "image_mean": 0.25, "do_rescale": null
        }))
        .unwrap();
        assert_eq!((cfg.min_pixels, cfg.max_pixels), (3136, 12845056));
        assert_eq!(cfg.image_mean, [0.25; 3]);
        assert!(cfg.do_rescale);
    }

    #[test]
    fn bad_fields_are_named() {
        for (v, field) in [
            (json!({"patch_size": -1}), "patch_size"),
            (json!({"merge_size": 0}), "merge_size"),
            (json!({"image_std": [0.5, 0.0, 0.5]}), "image_std"),
            (json!({"image_mean": [0.5, 0.5]}), "image_mean"),
            (json!({"size": {"height": 224, "width": 224}}), "size"),
            (json!({"resample": 2}), "resample"),
            (json!({"do_normalize": "yes"}), "do_normalize"),
            (json!({"rescale_factor": 0}), "rescale_factor"),
            (json!([1, 2]), "object"),
        ] {
            let e = parse(v.clone()).unwrap_err().to_string();
            assert!(e.contains(field), "{v}: {e}");
        }
    }

    #[test]
    fn missing_file_is_a_config_error() {
        let e = ImageProcessorConfig::from_dir(Path::new("/nonexistent-dir")).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        assert!(e.to_string().contains("preprocessor_config.json"), "{e}");
    }
}
