//! Images for vision-language models: decoding (PNG, JPEG, WebP) under size limits, and the
//! preprocessing of the models' Hugging Face image processors (resize, rescale, normalize,
//! patches).
