//! Image bytes to RGB pixels, as the reference loads them: `transformers.image_utils.load_image`
//! (pillow: decode, `ImageOps.exif_transpose`, `.convert("RGB")`) followed by the processor's
//! `convert_to_rgb`. PNG, JPEG and WebP only, the format told by the content; the size limits
//! are checked from the header before any pixel is decoded. pillow's RGB conversion is
//! reproduced: alpha is dropped, not composited (`convert("RGB")` runs first); 16-bit samples
//! keep their high byte, except 16-bit grey, which pillow clips at 255; and a PNG tRNS colour
//! key (one transparent palette index, or a grey / RGB key) survives `convert("RGB")` as a
//! colour, so `convert_to_rgb` paints every pixel of that colour white. Resizing and
//! normalization live in `resize` and `preprocess`.

use std::io::Cursor;
use std::panic::{catch_unwind, AssertUnwindSafe};

use image::codecs::jpeg::JpegDecoder;
use image::codecs::png::PngDecoder;
use image::codecs::webp::WebPDecoder;
use image::metadata::Orientation;
use image::{ColorType, DynamicImage, ImageDecoder, ImageError, RgbImage};

use crate::error::{Error, Result};

const PNG_SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";

/// Bounds on an untrusted image, checked before decoding (from the header) and passed to the
/// decoders as `image::Limits`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLimits {
    /// Most encoded bytes accepted.
    pub max_bytes: usize,
    /// Most decoded pixels (width x height) accepted.
    pub max_pixels: u64,
}

/// 20 MiB of encoded data, 40 megapixels decoded.
impl Default for ImageLimits {
    fn default() -> Self {
        Self {
            max_bytes: 20 << 20,
            max_pixels: 40_000_000,
        }
    }
}

impl ImageLimits {
    /// Bytes a decoder may allocate: the largest decoded buffer (8 bytes per pixel, 16-bit
    /// RGBA) plus slack for its own tables.
    fn max_alloc_bytes(&self) -> u64 {
        self.max_pixels.saturating_mul(8).saturating_add(64 << 20)
    }

    fn check_dimensions(&self, format: &str, width: u32, height: u32) -> Result<()> {
        if width == 0 || height == 0 {
            return Err(Error::InvalidImage(format!(
                "{format} has zero size ({width} x {height} pixels)"
            )));
        }
        let pixels = u64::from(width) * u64::from(height);
        if pixels > self.max_pixels {
            return Err(Error::InvalidImage(format!(
                "{format} of {width} x {height} = {pixels} pixels is over the limit of {} pixels",
                self.max_pixels
            )));
        }
        Ok(())
    }
}

/// The three formats decoded here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Png,
    Jpeg,
    WebP,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Png => "PNG",
            Format::Jpeg => "JPEG",
            Format::WebP => "WebP",
        }
    }

    /// The format told by the first bytes (signatures as pillow matches them).
    fn sniff(bytes: &[u8]) -> Result<Self> {
        if bytes.starts_with(PNG_SIGNATURE) {
            return Ok(Format::Png);
        }
        if bytes.starts_with(b"\xff\xd8\xff") {
            return Ok(Format::Jpeg);
        }
        if bytes.len() >= 12 && &bytes[..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
            return Ok(Format::WebP);
        }
        Err(Error::InvalidImage(match image::guess_format(bytes) {
            Ok(other) => {
                format!("unsupported image format {other:?}: only PNG, JPEG and WebP are accepted")
            }
            Err(_) => "not an image: the content is not PNG, JPEG or WebP".to_string(),
        }))
    }
}

/// Decodes PNG, JPEG or WebP `bytes` to RGB exactly as the reference loads them for the
/// processor (`load_image`, then `convert_to_rgb`; see the module doc), EXIF orientation
/// applied. Empty, oversized, truncated, corrupt or unknown input is an
/// [`Error::InvalidImage`] naming what is wrong; this never panics.
pub fn decode(bytes: &[u8], limits: &ImageLimits) -> Result<RgbImage> {
    decode_with(bytes, limits, true)
}

/// [`decode`], with the processor's colour-key step (`do_convert_rgb`) on or off.
pub(crate) fn decode_with(
    bytes: &[u8],
    limits: &ImageLimits,
    convert_rgb: bool,
) -> Result<RgbImage> {
    if bytes.is_empty() {
        return Err(Error::InvalidImage("empty input (0 bytes)".into()));
    }
    if bytes.len() > limits.max_bytes {
        return Err(Error::InvalidImage(format!(
            "{} bytes is over the limit of {} bytes",
            bytes.len(),
            limits.max_bytes
        )));
    }
    let format = Format::sniff(bytes)?;
    let key = if format == Format::Png {
        let (width, height) = png_size(bytes)?;
        limits.check_dimensions("PNG", width, height)?;
        if convert_rgb {
            png_color_key(bytes)
        } else {
            None
        }
    } else {
        if format == Format::Jpeg && !jpeg_has_end(bytes) {
            // pillow refuses these ("image file is truncated"); zune-jpeg would pad them.
            return Err(Error::InvalidImage(
                "truncated JPEG data: no end-of-image marker after the scan".into(),
            ));
        }
        None
    };
    // The decoders are third-party code fed untrusted bytes: a panic in one is an invalid image,
    // not a crashed server (the fuzz target still sees it: libFuzzer aborts on the panic hook).
    let decoded = catch_unwind(AssertUnwindSafe(|| decode_format(bytes, format, limits)))
        .map_err(|_| {
            Error::InvalidImage(format!(
                "corrupt {} data (the decoder failed)",
                format.name()
            ))
        })??;
    let (mut rgb, orientation) = decoded;
    if let Some(key) = key {
        for px in rgb.pixels_mut() {
            if px.0 == key {
                px.0 = [255; 3];
            }
        }
    }
    if orientation != Orientation::NoTransforms {
        let mut image = DynamicImage::ImageRgb8(rgb);
        image.apply_orientation(orientation);
        rgb = image.into_rgb8();
    }
    Ok(rgb)
}

/// Runs the format's decoder: RGB pixels (pillow's conversion) and the EXIF orientation.
fn decode_format(
    bytes: &[u8],
    format: Format,
    limits: &ImageLimits,
) -> Result<(RgbImage, Orientation)> {
    let name = format.name();
    let err = |e: ImageError| image_error(name, e);
    let mut lim = image::Limits::default();
    lim.max_alloc = Some(limits.max_alloc_bytes());
    let cursor = Cursor::new(bytes);
    match format {
        Format::Png => finish(
            PngDecoder::with_limits(cursor, lim.clone()).map_err(err)?,
            name,
            limits,
            lim,
        ),
        Format::Jpeg => finish(JpegDecoder::new(cursor).map_err(err)?, name, limits, lim),
        Format::WebP => finish(WebPDecoder::new(cursor).map_err(err)?, name, limits, lim),
    }
}

/// Checks the decoder's size against the limits, then decodes and converts to RGB.
fn finish(
    mut decoder: impl ImageDecoder,
    name: &str,
    limits: &ImageLimits,
    lim: image::Limits,
) -> Result<(RgbImage, Orientation)> {
    let (width, height) = decoder.dimensions();
    limits.check_dimensions(name, width, height)?;
    decoder.set_limits(lim).map_err(|e| image_error(name, e))?;
    // pillow ignores EXIF it cannot read; so does this.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let color = decoder.color_type();
    let n_bytes = usize::try_from(decoder.total_bytes())
        .ok()
        .filter(|&n| n as u64 <= limits.max_alloc_bytes())
        .ok_or_else(|| {
            Error::InvalidImage(format!(
                "{name} of {width} x {height} pixels needs more than {} bytes to decode",
                limits.max_alloc_bytes()
            ))
        })?;
    let mut buf = vec![0u8; n_bytes];
    decoder
        .read_image(&mut buf)
        .map_err(|e| image_error(name, e))?;
    let rgb = to_rgb(&buf, color, name)?;
    let image = RgbImage::from_raw(width, height, rgb)
        .expect("the decoder fills width * height pixels, converted to 3 bytes each");
    Ok((image, orientation))
}

/// pillow's `convert("RGB")` of what the decoders give (PNG expanded to 8 or 16 bits per
/// sample): grey replicated, alpha dropped, 16-bit samples to their high byte except 16-bit
/// grey (pillow's `I;16` mode), which is clipped at 255.
fn to_rgb(buf: &[u8], color: ColorType, name: &str) -> Result<Vec<u8>> {
    let u16s = || {
        buf.chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]))
    };
    let high = |v: u16| (v >> 8) as u8;
    let out: Vec<u8> = match color {
        ColorType::Rgb8 => buf.to_vec(),
        ColorType::Rgba8 => buf
            .chunks_exact(4)
            .flat_map(|p| [p[0], p[1], p[2]])
            .collect(),
        ColorType::L8 => buf.iter().flat_map(|&g| [g; 3]).collect(),
        ColorType::La8 => buf.chunks_exact(2).flat_map(|p| [p[0]; 3]).collect(),
        ColorType::Rgb16 => u16s().map(high).collect(),
        ColorType::Rgba16 => u16s()
            .enumerate()
            .filter(|(i, _)| i % 4 != 3)
            .map(|(_, v)| high(v))
            .collect(),
        ColorType::L16 => u16s().flat_map(|v| [v.min(255) as u8; 3]).collect(),
        ColorType::La16 => u16s().step_by(2).flat_map(|v| [high(v); 3]).collect(),
        other => {
            return Err(Error::InvalidImage(format!(
                "{name} with unsupported pixel format {other:?}"
            )))
        }
    };
    Ok(out)
}

/// The image crate's error, as a message naming the format and whether the data ended early.
fn image_error(name: &str, e: ImageError) -> Error {
    Error::InvalidImage(match e {
        ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            format!("truncated {name} data: {io}")
        }
        ImageError::Limits(l) => format!("{name} is over a decoding limit: {l}"),
        ImageError::Unsupported(u) => format!("unsupported {name} feature: {u}"),
        ImageError::Decoding(d) => {
            let text = d.to_string();
            let lower = text.to_lowercase();
            if lower.contains("eof") || lower.contains("end of") || lower.contains("no more") {
                format!("truncated {name} data: {text}")
            } else {
                format!("corrupt {name} data: {text}")
            }
        }
        other => format!("invalid {name} data: {other}"),
    })
}

/// Width and height from a PNG's IHDR (the first chunk), read without decoding anything.
fn png_size(bytes: &[u8]) -> Result<(u32, u32)> {
    let ihdr = bytes.get(8..24).ok_or_else(|| {
        Error::InvalidImage(format!(
            "truncated PNG: {} bytes end inside the header",
            bytes.len()
        ))
    })?;
    if &ihdr[4..8] != b"IHDR" {
        return Err(Error::InvalidImage(
            "corrupt PNG data: the first chunk is not IHDR".into(),
        ));
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Ok((be(&ihdr[8..12]), be(&ihdr[12..16])))
}

/// Whether a JPEG's end-of-image marker (FF D9) follows its first scan: the marker segments
/// before the first start-of-scan are skipped by their lengths (an EXIF thumbnail inside them
/// has its own FF D9), then FF D9 is looked for (entropy-coded data never holds it).
fn jpeg_has_end(bytes: &[u8]) -> bool {
    let mut pos = 2;
    loop {
        let Some(&[0xff, marker]) = bytes.get(pos..pos + 2) else {
            return false;
        };
        match marker {
            0xff => pos += 1, // fill byte
            0xda => break,
            0x01 | 0xd0..=0xd7 => pos += 2,
            _ => {
                let Some(len) = bytes.get(pos + 2..pos + 4) else {
                    return false;
                };
                pos += 2 + usize::from(u16::from_be_bytes([len[0], len[1]]));
            }
        }
    }
    bytes[pos..].windows(2).any(|w| w == [0xff, 0xd9])
}

/// The colour pillow keeps as `info["transparency"]` after `convert("RGB")`, which the
/// processor's `convert_to_rgb` turns white: a palette image whose tRNS makes exactly one index
/// fully transparent and every other opaque (that index's colour, black past the palette); an
/// 8-bit-or-less grey image's tRNS grey (up to 255); an RGB image's tRNS colour, each sample's
/// low byte. None otherwise (16-bit grey, other alpha tables, no tRNS). Reads the chunks
/// before IDAT only.
fn png_color_key(bytes: &[u8]) -> Option<[u8; 3]> {
    let (mut color_type, mut bit_depth) = (None, 0u8);
    let (mut palette, mut trns): (&[u8], Option<&[u8]>) = (&[], None);
    let mut pos = PNG_SIGNATURE.len();
    while let Some(head) = bytes.get(pos..pos + 8) {
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let data = bytes.get(pos + 8..(pos + 8).checked_add(len)?)?;
        match &head[4..8] {
            b"IHDR" if data.len() >= 10 => {
                bit_depth = data[8];
                color_type = Some(data[9]);
            }
            b"PLTE" => palette = data,
            b"tRNS" => trns = Some(data),
            b"IDAT" | b"IEND" => break,
            _ => {}
        }
        pos = pos.checked_add(len)?.checked_add(12)?;
    }
    let trns = trns?;
    let be16 = |i: usize| trns.get(i..i + 2).map(|b| u16::from_be_bytes([b[0], b[1]]));
    match color_type? {
        3 => {
            // pillow's `_simple_palette`: b"^\xff*\x00\xff*$".
            let zero = trns.iter().position(|&a| a == 0)?;
            if trns
                .iter()
                .enumerate()
                .any(|(i, &a)| i != zero && a != 0xff)
            {
                return None;
            }
            Some(match palette.get(zero * 3..zero * 3 + 3) {
                Some(c) => [c[0], c[1], c[2]],
                None => [0; 3],
            })
        }
        0 if bit_depth <= 8 => {
            let g = u8::try_from(be16(0)?).ok()?;
            Some([g; 3])
        }
        2 => Some([
            be16(0)? as u8, // the low byte: pillow packs the key with `& 0xff`
            be16(2)? as u8,
            be16(4)? as u8,
        ]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut c = (data.len() as u32).to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        c.extend_from_slice(&[0; 4]); // CRC: not read by the key scan
        c
    }

    fn png_with(color_type: u8, bit_depth: u8, extra: &[Vec<u8>]) -> Vec<u8> {
        let mut ihdr = 4u32.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&1u32.to_be_bytes());
        ihdr.extend_from_slice(&[bit_depth, color_type, 0, 0, 0]);
        let mut f = PNG_SIGNATURE.to_vec();
        f.extend(chunk(b"IHDR", &ihdr));
        for c in extra {
            f.extend_from_slice(c);
        }
        f.extend(chunk(b"IDAT", &[]));
        f
    }

    #[test]
    fn color_keys_follow_pillow() {
        let plte = chunk(b"PLTE", &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let simple = png_with(3, 8, &[plte.clone(), chunk(b"tRNS", &[255, 0])]);
        assert_eq!(png_color_key(&simple), Some([4, 5, 6]));
        let alphas = png_with(3, 8, &[plte.clone(), chunk(b"tRNS", &[128, 0])]);
        assert_eq!(png_color_key(&alphas), None);
        let past = png_with(3, 8, &[plte, chunk(b"tRNS", &[255, 255, 255, 0])]);
        assert_eq!(png_color_key(&past), Some([0, 0, 0]));
        let grey = png_with(0, 8, &[chunk(b"tRNS", &[0, 7])]);
        assert_eq!(png_color_key(&grey), Some([7; 3]));
        let grey16 = png_with(0, 16, &[chunk(b"tRNS", &[0, 7])]);
        assert_eq!(png_color_key(&grey16), None);
        let rgb = png_with(2, 8, &[chunk(b"tRNS", &[1, 44, 0, 20, 0, 30])]);
        assert_eq!(png_color_key(&rgb), Some([44, 20, 30]));
        let rgba = png_with(6, 8, &[chunk(b"tRNS", &[0, 1, 0, 2, 0, 3])]);
        assert_eq!(png_color_key(&rgba), None);
    }

    #[test]
    fn sixteen_bit_samples_follow_pillow() {
        let px = |v: [u16; 3]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let rgb = to_rgb(&px([0x1234, 0x00ff, 0xff00]), ColorType::Rgb16, "PNG").unwrap();
        assert_eq!(rgb, vec![0x12, 0x00, 0xff]);
        let grey = to_rgb(&px([100, 255, 256]), ColorType::L16, "PNG").unwrap();
        assert_eq!(grey, vec![100, 100, 100, 255, 255, 255, 255, 255, 255]);
    }
}
