//! Image decoding and preprocessing against transformers 5.24's `Qwen2VLImageProcessor`
//! (torchvision backend) fed by `load_image` (pillow), on the fixtures of
//! `scripts/gen_vision_preprocess_reference.py` (`tests/fixtures/vision/`): decoded pixels,
//! torch's uint8 antialiased bicubic resize, `smart_resize`, `pixel_values` (bit for bit, by
//! SHA-256) and `image_grid_thw` for five processor settings; then bad input.

use std::path::{Path, PathBuf};
use std::time::Instant;

use lattice_inference::vision::{
    decode, load, preprocess, resize, smart_resize, ImageLimits, ImageProcessorConfig, RgbImage,
};
use lattice_inference::Error;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision")
}

fn manifest() -> Value {
    let text = std::fs::read(dir().join("manifest.json")).expect("manifest.json");
    serde_json::from_slice(&text).expect("manifest.json parses")
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn setting(m: &Value, name: &str) -> ImageProcessorConfig {
    ImageProcessorConfig::from_json(&m["settings"][name], Path::new(name)).expect(name)
}

fn usizes(v: &Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as usize)
        .collect()
}

/// Files whose decoders may legitimately differ from pillow's (lossy codecs).
fn is_lossy(name: &str) -> bool {
    name.starts_with("jpeg") || name == "webp_lossy"
}

/// pillow's decode of a lossy fixture (saved losslessly by the script).
fn reference_decoded(name: &str) -> RgbImage {
    let bytes = std::fs::read(dir().join(format!("decoded/{name}.png"))).expect("decoded png");
    decode(&bytes, &ImageLimits::default()).expect("reference png decodes")
}

/// Max absolute difference and fraction of differing samples between two equal-sized images.
fn diff(a: &RgbImage, b: &RgbImage) -> (u8, f64) {
    assert_eq!(a.dimensions(), b.dimensions());
    let (mut max, mut n) = (0u8, 0usize);
    for (x, y) in a.as_raw().iter().zip(b.as_raw()) {
        let d = x.abs_diff(*y);
        max = max.max(d);
        n += usize::from(d != 0);
    }
    (max, n as f64 / a.as_raw().len() as f64)
}

/// Measured differences of our decoders (zune-jpeg through `image`, image-webp) from pillow's
/// (libjpeg-turbo 3.1.2, libwebp 1.6.0) on the lossy fixtures, asserted as bounds: the max
/// |difference| of a decoded sample, the fraction of samples that differ, and the max
/// |difference| of `pixel_values` after the processor (in levels of 1 / 127.5) for the small and
/// the Qwen3-VL settings. zune-jpeg rounds its chroma upsampling in two steps where
/// libjpeg-turbo's "fancy" upsampling rounds once, and its IDCT and colour conversion round
/// differently; lossy WebP and every lossless file decode exactly.
fn lossy_bound(name: &str) -> (u8, f64, [u8; 2]) {
    match name {
        "jpeg_420" => (3, 0.2582, [3, 4]),
        "jpeg_444" => (2, 0.0127, [2, 3]),
        "jpeg_progressive" => (3, 0.2542, [3, 4]),
        "jpeg_gray" => (1, 0.0092, [1, 2]),
        "jpeg_cmyk" => (1, 0.0103, [1, 2]),
        "jpeg_exif6" => (7, 0.2716, [7, 9]),
        "webp_lossy" => (0, 0.0, [0, 0]),
        other => panic!("no measured bound for {other}"),
    }
}

#[test]
fn decode_matches_pillow() {
    let m = manifest();
    let limits = ImageLimits::default();
    for img in m["images"].as_array().unwrap() {
        let name = img["name"].as_str().unwrap();
        let bytes = std::fs::read(dir().join(img["file"].as_str().unwrap())).unwrap();
        let ours = decode(&bytes, &limits).unwrap_or_else(|e| panic!("{name}: {e}"));
        let size = usizes(&img["size"]);
        assert_eq!(
            [ours.height() as usize, ours.width() as usize],
            [size[0], size[1]],
            "{name}: size"
        );
        let hash = sha256_hex(ours.as_raw());
        if is_lossy(name) {
            let (max, frac) = diff(&ours, &reference_decoded(name));
            eprintln!(
                "decode {name}: max |ours - pillow| = {max}, {:.3}% of samples differ",
                frac * 100.0
            );
            let (bound, frac_bound, _) = lossy_bound(name);
            assert!(max <= bound && frac <= frac_bound, "{name}: {max} {frac}");
        } else {
            assert_eq!(hash, img["decoded_sha256"], "{name}: decoded pixels");
        }
    }
}

#[test]
fn preprocess_matches_transformers_bit_for_bit() {
    let m = manifest();
    let names: Vec<&str> = m["settings"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut n_cases = 0;
    for img in m["images"].as_array().unwrap() {
        let name = img["name"].as_str().unwrap();
        // The processor's input: pillow's pixels (equal to ours for the lossless files).
        let pixels = if is_lossy(name) {
            reference_decoded(name)
        } else {
            let bytes = std::fs::read(dir().join(img["file"].as_str().unwrap())).unwrap();
            decode(&bytes, &ImageLimits::default()).unwrap()
        };
        for &s in &names {
            let cfg = setting(&m, s);
            let case = &img["cases"][s];
            let resized_hw = usizes(&case["resized"]);
            let (h, w) = (pixels.height() as usize, pixels.width() as usize);
            assert_eq!(
                smart_resize(h, w, cfg.factor(), cfg.min_pixels, cfg.max_pixels).unwrap(),
                (resized_hw[0], resized_hw[1]),
                "{name} {s}: smart_resize"
            );
            let resized = resize(&pixels, resized_hw[0], resized_hw[1]).unwrap();
            assert_eq!(
                sha256_hex(resized.as_raw()),
                case["resized_sha256"],
                "{name} {s}: resized pixels"
            );
            let out = preprocess(&pixels, &cfg).unwrap();
            assert_eq!(
                out.grid_thw.to_vec(),
                usizes(&case["grid_thw"]),
                "{name} {s}: grid"
            );
            assert_eq!(
                out.pixel_values.len(),
                out.n_patches() * cfg.patch_dim(),
                "{name} {s}: shape"
            );
            assert_eq!(
                sha256_hex(&f32_bytes(&out.pixel_values)),
                case["pixel_sha256"],
                "{name} {s}: pixel_values"
            );
            n_cases += 1;
        }
    }
    eprintln!("{n_cases} image x setting cases equal transformers' pixel_values bit for bit");
}

#[test]
fn load_equals_reference_values_directly() {
    // The one case committed as raw f32: compared value by value, end to end from the file.
    let m = manifest();
    let cfg = setting(&m, "small");
    let bytes = std::fs::read(dir().join("images/tiny.png")).unwrap();
    let out = load(&bytes, &ImageLimits::default(), &cfg).unwrap();
    let raw = std::fs::read(dir().join("tiny.small.pixels.bin")).unwrap();
    let reference: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(out.pixel_values.len(), reference.len());
    let max = out
        .pixel_values
        .iter()
        .zip(&reference)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(max <= 1e-6, "max abs diff {max}");
    assert_eq!(out.grid_thw, [1, 2, 4]);
    assert_eq!(out.merged_tokens(cfg.merge_size), 2);
}

#[test]
fn lossy_files_end_to_end() {
    // What the decoder difference does to pixel_values: ours from the file against the
    // reference (our preprocess of pillow's pixels, equal to transformers' by the test above).
    let m = manifest();
    for img in m["images"].as_array().unwrap() {
        let name = img["name"].as_str().unwrap();
        if !is_lossy(name) {
            continue;
        }
        let bytes = std::fs::read(dir().join(img["file"].as_str().unwrap())).unwrap();
        for (i, s) in ["small", "qwen3_vl"].into_iter().enumerate() {
            let cfg = setting(&m, s);
            let ours = load(&bytes, &ImageLimits::default(), &cfg).unwrap();
            let reference = preprocess(&reference_decoded(name), &cfg).unwrap();
            assert_eq!(ours.grid_thw, reference.grid_thw);
            let (mut max, mut n) = (0.0f32, 0usize);
            for (a, b) in ours.pixel_values.iter().zip(&reference.pixel_values) {
                max = max.max((a - b).abs());
                n += usize::from(a != b);
            }
            eprintln!(
                "end to end {name} {s}: max |pixel_values diff| = {max:.6} ({:.1} levels), {:.3}% differ",
                max * 127.5,
                100.0 * n as f64 / ours.pixel_values.len() as f64
            );
            let levels = lossy_bound(name).2[i];
            assert!(max <= f32::from(levels) / 127.5 + 1e-6, "{name} {s}: {max}");
        }
    }
}

/// Byte `i` of the noise image `seed`: splitmix64's output for `i + seed * golden`, low byte
/// (the script's `noise`).
fn noise(h: usize, w: usize, seed: u64) -> RgbImage {
    let data = (0..(h * w * 3) as u64)
        .map(|i| {
            let mut x = i.wrapping_add(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (x ^ (x >> 31)) as u8
        })
        .collect();
    RgbImage::from_raw(w as u32, h as u32, data).unwrap()
}

#[test]
fn resize_matches_torch_on_noise() {
    let m = manifest();
    for case in m["resize_cases"].as_array().unwrap() {
        let (i, o) = (usizes(&case["in"]), usizes(&case["out"]));
        let src = noise(i[0], i[1], case["seed"].as_u64().unwrap());
        let out = resize(&src, o[0], o[1]).unwrap();
        assert_eq!(sha256_hex(out.as_raw()), case["sha256"], "{i:?} -> {o:?}");
    }
}

/// The resize written as plainly as possible (per output sample, weights recomputed, no
/// skipped passes): the oracle for the optimized passes.
fn naive_resize(src: &RgbImage, oh: usize, ow: usize) -> RgbImage {
    fn weights(n_in: usize, n_out: usize) -> (Vec<(usize, Vec<i64>)>, u32) {
        let scale = n_in as f64 / n_out as f64;
        let support = if scale >= 1.0 { 2.0 * scale } else { 2.0 };
        let inv = if scale >= 1.0 { 1.0 / scale } else { 1.0 };
        let taps = support.ceil() as i64 * 2 + 1;
        let cubic = |x: f64| {
            let (a, x) = (-0.5, x.abs());
            if x < 1.0 {
                ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
            } else if x < 2.0 {
                ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
            } else {
                0.0
            }
        };
        let mut rows = Vec::new();
        let mut wt_max = 0.0f64;
        for i in 0..n_out {
            let c = scale * (i as f64 + 0.5);
            let lo = ((c - support + 0.5) as i64).max(0);
            let hi = ((c + support + 0.5) as i64).min(n_in as i64);
            let n = (hi - lo).clamp(0, taps);
            let w: Vec<f64> = (0..n)
                .map(|j| cubic(((j + lo) as f64 - c + 0.5) * inv))
                .collect();
            let total: f64 = w.iter().sum();
            let w: Vec<f64> = w.iter().map(|x| x / total).collect();
            wt_max = w.iter().copied().fold(wt_max, f64::max);
            rows.push((lo as usize, w));
        }
        let mut p = 0;
        while p < 22 && ((0.5 + wt_max * (1u64 << (p + 1)) as f64) as i64) < (1 << 15) {
            p += 1;
        }
        let rows = rows
            .into_iter()
            .map(|(lo, w)| {
                let k = w
                    .iter()
                    .map(|x| {
                        let v = x * (1u64 << p) as f64;
                        if v < 0.0 {
                            (v - 0.5) as i64
                        } else {
                            (v + 0.5) as i64
                        }
                    })
                    .collect();
                (lo, k)
            })
            .collect();
        (rows, p)
    }
    let (h, w) = (src.height() as usize, src.width() as usize);
    let (hx, px) = weights(w, ow);
    let (vy, py) = weights(h, oh);
    let round = |sum: i64, p: u32| ((sum + (1 << p >> 1)) >> p).clamp(0, 255) as u8;
    let horizontal = |y: usize, x: usize, c: usize| {
        let (lo, k) = &hx[x];
        let sum: i64 = k
            .iter()
            .enumerate()
            .map(|(j, kj)| kj * i64::from(src.get_pixel((lo + j) as u32, y as u32).0[c]))
            .sum();
        if w == ow {
            src.get_pixel(x as u32, y as u32).0[c]
        } else {
            round(sum, px)
        }
    };
    RgbImage::from_fn(ow as u32, oh as u32, |x, y| {
        let mut px_out = [0u8; 3];
        for (c, o) in px_out.iter_mut().enumerate() {
            *o = if h == oh {
                horizontal(y as usize, x as usize, c)
            } else {
                let (lo, k) = &vy[y as usize];
                let sum: i64 = k
                    .iter()
                    .enumerate()
                    .map(|(j, kj)| kj * i64::from(horizontal(lo + j, x as usize, c)))
                    .sum();
                round(sum, py)
            };
        }
        image::Rgb(px_out)
    })
}

#[test]
fn resize_matches_naive_oracle_on_awkward_sizes() {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        1 + (state % n) as usize
    };
    for seed in 0..40 {
        let (h, w) = (next(90), next(90));
        let (oh, ow) = (next(120), next(120));
        let src = noise(h, w, 1000 + seed);
        assert_eq!(
            resize(&src, oh, ow).unwrap(),
            naive_resize(&src, oh, ow),
            "{h} x {w} -> {oh} x {ow}"
        );
    }
}

#[test]
fn smart_resize_matches_python() {
    let m = manifest();
    let rows = m["smart_resize"].as_array().unwrap();
    for row in rows {
        let a: Vec<usize> = row.as_array().unwrap()[..5]
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let got = smart_resize(a[0], a[1], a[2], a[3], a[4]);
        if row[5] == "error" {
            let e = got.expect_err(&format!("{row}: Python raised"));
            assert!(e.to_string().contains("aspect ratio"), "{e}");
        } else {
            assert_eq!(
                got.unwrap_or_else(|e| panic!("{row}: {e}")),
                (
                    row[5].as_u64().unwrap() as usize,
                    row[6].as_u64().unwrap() as usize
                ),
                "{row}"
            );
        }
    }
    eprintln!("{} smart_resize cases equal Python's", rows.len());
}

#[test]
fn config_files_read_as_transformers_does() {
    let m = manifest();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("preprocessor_config.json"),
        serde_json::to_vec(&m["settings"]["qwen3_vl"]).unwrap(),
    )
    .unwrap();
    let cfg = ImageProcessorConfig::from_dir(tmp.path()).unwrap();
    assert_eq!(cfg, ImageProcessorConfig::default());
    assert_eq!(cfg.grid_thw(1080, 1920).unwrap(), [1, 68, 120]);
    let legacy = setting(&m, "small_clip");
    assert_eq!(
        (legacy.min_pixels, legacy.max_pixels),
        (56 * 56, 28 * 28 * 16)
    );
    assert_eq!(legacy.patch_size, 14);
}

/// A PNG signature and an IHDR chunk (correct CRC) for `width` x `height` RGB, then `rest`.
fn png_header(width: u32, height: u32, rest: &[u8]) -> Vec<u8> {
    let mut data = b"IHDR".to_vec();
    data.extend_from_slice(&width.to_be_bytes());
    data.extend_from_slice(&height.to_be_bytes());
    data.extend_from_slice(&[8, 2, 0, 0, 0]);
    let crc = crc32(&data);
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    f.extend_from_slice(&13u32.to_be_bytes());
    f.extend_from_slice(&data);
    f.extend_from_slice(&crc.to_be_bytes());
    f.extend_from_slice(rest);
    f
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn image_error(bytes: &[u8], limits: &ImageLimits) -> String {
    match decode(bytes, limits) {
        Err(Error::InvalidImage(msg)) => msg,
        Err(other) => panic!("not an InvalidImage error: {other}"),
        Ok(img) => panic!("decoded {:?}", img.dimensions()),
    }
}

#[test]
fn bad_input_is_refused_with_a_clear_error() {
    let limits = ImageLimits::default();
    let file = |name: &str| std::fs::read(dir().join("images").join(name)).unwrap();
    let cases: Vec<(&str, Vec<u8>, ImageLimits, &[&str])> = vec![
        ("zero bytes", vec![], limits, &["empty"]),
        (
            "text",
            b"just some text, not an image\n".to_vec(),
            limits,
            &["not an image"],
        ),
        (
            "gif",
            b"GIF89a\x01\x00\x01\x00\x00\x00\x00;".to_vec(),
            limits,
            &["unsupported image format", "Gif"],
        ),
        (
            "png cut in the header",
            file("rgb.png")[..20].to_vec(),
            limits,
            &["truncated PNG"],
        ),
        (
            "png cut in half",
            file("rgb.png")[..6000].to_vec(),
            limits,
            &["truncated PNG"],
        ),
        (
            "jpeg cut in half",
            file("jpeg_420.jpg")[..1900].to_vec(),
            limits,
            &["truncated JPEG"],
        ),
        (
            "jpeg without its end marker",
            {
                let f = file("jpeg_420.jpg");
                f[..f.len() - 2].to_vec()
            },
            limits,
            &["truncated JPEG"],
        ),
        (
            "progressive jpeg cut",
            file("jpeg_progressive.jpg")[..2000].to_vec(),
            limits,
            &["truncated JPEG"],
        ),
        (
            "webp cut",
            file("webp_lossless.webp")[..3000].to_vec(),
            limits,
            &["WebP"],
        ),
        (
            "20000 x 20000 png header",
            png_header(20_000, 20_000, &[]),
            limits,
            &["20000 x 20000", "400000000 pixels", "limit of 40000000"],
        ),
        (
            "zero-width png",
            png_header(0, 10, &[]),
            limits,
            &["zero size"],
        ),
        (
            "too many bytes",
            file("rgb.png"),
            ImageLimits {
                max_bytes: 1000,
                ..limits
            },
            &["13720 bytes", "limit of 1000 bytes"],
        ),
        (
            "too many pixels",
            file("jpeg_420.jpg"),
            ImageLimits {
                max_pixels: 5000,
                ..limits
            },
            &["123 x 77", "limit of 5000 pixels"],
        ),
        (
            "garbage after a png signature",
            {
                let mut f = file("rgb.png");
                f[40..400].fill(0x5a);
                f
            },
            limits,
            &["PNG"],
        ),
    ];
    for (what, bytes, lim, needles) in cases {
        let msg = image_error(&bytes, &lim);
        eprintln!("{what}: {msg}");
        for n in needles {
            assert!(msg.contains(n), "{what}: `{msg}` lacks `{n}`");
        }
    }
}

#[test]
fn damaged_files_never_panic() {
    // Every fixture cut at many lengths and with bytes flipped: an image or an error, no panic.
    let mut n = 0;
    for entry in std::fs::read_dir(dir().join("images")).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let step = (bytes.len() / 40).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            let _ = decode(&bytes[..cut], &ImageLimits::default());
            let mut flipped = bytes.clone();
            flipped[cut] ^= 0x55;
            flipped[(cut * 7 + 13) % bytes.len()] = 0xff;
            let _ = decode(&flipped, &ImageLimits::default());
            n += 2;
        }
    }
    eprintln!("{n} damaged inputs decoded or refused");
}

#[test]
fn resize_speed() {
    // 1024 x 768 (a photo) to 448 x 448 and to what the Qwen3-VL settings give a 4:3 photo.
    let src = noise(768, 1024, 7);
    for (oh, ow) in [(448, 448), (384, 512), (672, 896)] {
        let _ = resize(&src, oh, ow).unwrap();
        let runs = 10;
        let t = Instant::now();
        for _ in 0..runs {
            std::hint::black_box(resize(&src, oh, ow).unwrap());
        }
        let ms = t.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
        eprintln!("resize 768 x 1024 -> {oh} x {ow}: {ms:.2} ms");
        if !cfg!(debug_assertions) {
            assert!(ms < 200.0, "{ms} ms");
        }
    }
    let (cfg, img) = (ImageProcessorConfig::default(), noise(768, 1024, 8));
    let out = preprocess(&img, &cfg).unwrap();
    let t = Instant::now();
    for _ in 0..5 {
        std::hint::black_box(preprocess(&img, &cfg).unwrap());
    }
    eprintln!(
        "preprocess 768 x 1024 (Qwen3-VL settings, no resize, grid {:?}): {:.2} ms",
        out.grid_thw,
        t.elapsed().as_secs_f64() * 1e3 / 5.0
    );
}
