//! Images for vision-language models: decoding (PNG, JPEG, WebP) under size limits, and the
//! preprocessing of the models' Hugging Face image processors (resize, rescale, normalize,
//! patches).
//!
//! The reference is transformers' default processor for Qwen2-VL, Qwen3-VL and Qwen3.5
//! (`Qwen2VLImageProcessor`, torchvision backend) fed by `load_image`; `pixel_values` and
//! `image_grid_thw` equal it bit for bit on the same decoded pixels
//! (`tests/vision_preprocess.rs`). [`config`] reads `preprocessor_config.json`, [`decode`]
//! turns bytes into RGB pixels, [`resize`] holds `smart_resize` and the uint8 antialiased
//! bicubic resize, [`preprocess`] normalizes and lays out patches. The vision tower itself is
//! in `model/`.

pub mod config;
pub mod decode;
pub mod preprocess;
pub mod resize;

pub use config::ImageProcessorConfig;
pub use decode::{decode, ImageLimits};
pub use image::RgbImage;
pub use preprocess::{load, preprocess, PreparedImage};
pub use resize::{resize, smart_resize};
