//! Images in chat requests (OpenAI `image_url` content parts) for vision-language models:
//! `data:image/...;base64,` URLs decoded in place; `http(s)` URLs refused unless the server
//! runs with `--allow-image-urls`, then fetched within the image byte limit and a time limit;
//! at most `--max-images` per request; each image decoded and prepared for the model on the
//! blocking pool. Every refusal is a 400 naming the content part and the limit.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use lattice_inference::engine::TextModel;
use lattice_inference::vision::{ImageLimits, PreparedImage};

use crate::error::ApiError;
use crate::ServeOptions;

/// One `image_url` part of a request, with the JSON path that names it in errors.
#[derive(Debug, Clone)]
pub struct ImageRef {
    /// `messages[i].content[j].image_url.url`.
    pub path: String,
    /// The URL as sent.
    pub url: String,
}

/// Time allowed to fetch one remote image (with `--allow-image-urls`).
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// The image limits of a server.
pub fn limits(options: &ServeOptions) -> ImageLimits {
    ImageLimits {
        max_bytes: options.max_image_bytes,
        max_pixels: options.max_image_pixels,
    }
}

/// The bytes of one image URL: a data URL's payload, or (when allowed) a fetched URL's body.
fn bytes_of(r: &ImageRef, options: &ServeOptions) -> Result<Vec<u8>, ApiError> {
    let bad = |m: String| ApiError::invalid_param(r.path.clone(), m);
    let max = options.max_image_bytes;
    if let Some(rest) = r.url.strip_prefix("data:") {
        let (meta, payload) = rest
            .split_once(',')
            .ok_or_else(|| bad("a data URL needs a `,` before its payload".into()))?;
        if !meta.ends_with(";base64") {
            return Err(bad(
                "only base64 data URLs are supported (`data:image/png;base64,...`)".into(),
            ));
        }
        if payload.len() / 4 * 3 > max + 3 {
            return Err(bad(format!(
                "the image is larger than {max} bytes (--max-image-bytes)"
            )));
        }
        return base64::engine::general_purpose::STANDARD
            .decode(payload.trim())
            .map_err(|e| bad(format!("the data URL's base64 payload is invalid: {e}")));
    }
    let lower = r.url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        return Err(bad(
            "an image URL must be a `data:` URL (or http(s) with --allow-image-urls)".into(),
        ));
    }
    if !options.allow_image_urls {
        return Err(bad(
            "remote image URLs are refused by this server; send the image as a data URL (`data:image/png;base64,...`) or start it with --allow-image-urls".into(),
        ));
    }
    let agent = ureq::AgentBuilder::new()
        .timeout(FETCH_TIMEOUT)
        .redirects(3)
        .build();
    let resp = agent
        .get(&r.url)
        .call()
        .map_err(|e| bad(format!("fetching the image failed: {e}")))?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(max as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|e| bad(format!("reading the image failed: {e}")))?;
    if body.len() > max {
        return Err(bad(format!(
            "the image is larger than {max} bytes (--max-image-bytes)"
        )));
    }
    Ok(body)
}

/// Decodes and prepares every image of a request for `model` (blocking: run it on the
/// blocking pool).
pub fn prepare(
    model: &TextModel,
    refs: &[ImageRef],
    options: &ServeOptions,
) -> Result<Vec<Arc<PreparedImage>>, ApiError> {
    if refs.is_empty() {
        return Ok(Vec::new());
    }
    if model.vision.is_none() {
        return Err(ApiError::invalid_param(
            refs[0].path.clone(),
            "this model takes no images (it has no vision tower)",
        ));
    }
    if refs.len() > options.max_images {
        return Err(ApiError::invalid_param(
            refs[options.max_images].path.clone(),
            format!(
                "{} images in the request; this server takes at most {} (--max-images)",
                refs.len(),
                options.max_images
            ),
        ));
    }
    let limits = limits(options);
    refs.iter()
        .map(|r| {
            let bytes = bytes_of(r, options)?;
            model.prepare_image(&bytes, &limits).map_err(|e| {
                ApiError::invalid_param(
                    r.path.clone(),
                    format!(
                        "{e} (this server's limits: --max-image-bytes {}, --max-image-pixels {})",
                        options.max_image_bytes, options.max_image_pixels
                    ),
                )
            })
        })
        .collect()
}
