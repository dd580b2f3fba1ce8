#!/usr/bin/env python3
"""Test images and the transformers reference for Lattice's image preprocessing (crates/inference/src/vision).

The reference is what Qwen3-VL and Qwen3.5 get from transformers 5.24: `transformers.image_utils.load_image(path)`
(PIL decode, EXIF transpose, `.convert("RGB")`) handed to the default `Qwen2VLImageProcessor` (the torchvision
backend: `convert_to_rgb` of the PIL image, uint8 antialiased bicubic resize, fused rescale + normalize, patches).

Writes (committed) under crates/inference/tests/fixtures/vision/:
  images/<name>.<png|jpg|webp>  the inputs: odd sizes, every PNG colour type the loader converts (RGB, RGBA, L, LA,
                                palette with and without a transparent index, 16-bit RGB and grey, RGB with a tRNS
                                colour key), JPEG 4:2:0 / 4:4:4 / progressive / grey / CMYK / EXIF-rotated, WebP
                                lossless / lossy / with alpha / EXIF-rotated, PNGs with each EXIF orientation 2-8,
                                a 1:30 strip, one upscaled by min_pixels and one downscaled by max_pixels
  decoded/<name>.png            for the lossy files (JPEG, lossy WebP), the RGB image the processor starts from
                                (load_image + convert_to_rgb), saved losslessly; other decoders may differ there
  tiny.small.pixels.bin         one full pixel_values (raw little-endian f32 [patches, 1536]) for a direct comparison
  manifest.json
    settings: {name: preprocessor_config.json contents}  (small: patch 16 / merge 2 / 32*32..64*64*4 pixels;
              small_clip: patch 14 and CLIP mean/std in the older min_pixels / max_pixels keys; rescale_only and
              normalize_only: the unfused value paths; qwen3_vl: the checkpoints' own file)
    images: [{name, file, size [h, w], decoded_sha256 (of that RGB image, HWC), torchvision_decode_equal, cases: {setting: {grid_thw, resized [h, w],
              pixel_sha256 (sha256 of the f32 pixel_values, little-endian, processor order), resized_sha256 (sha256
              of the resized uint8 image, HWC), pil_max_abs_diff (the PIL backend's pixel_values against these)}}]}]
    resize_cases: [{in [h, w], out [h, w], seed, sha256}]   torch's uint8 antialiased bicubic resize of noise
              (splitmix64 bytes, as `noise` below) hashed HWC
    smart_resize: [[h, w, factor, min_pixels, max_pixels, h', w'] or [..., "error"]]

`torchvision_decode_equal` records whether the processor's own path for a file name (torchvision.io.decode_image,
which the torchvision backend uses when given a path) decodes the same pixels as load_image; it is informational.

Usage: .cache/venv-ref/bin/python scripts/gen_vision_preprocess_reference.py   (see scripts/setup_reference_env.sh)
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw

warnings.filterwarnings("ignore")

from transformers.image_transforms import convert_to_rgb  # noqa: E402
from transformers.image_utils import load_image, load_image_as_tensor  # noqa: E402
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil  # noqa: E402
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "inference" / "tests" / "fixtures" / "vision"
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
SETTINGS = {
    "small": {
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64 * 4},
    },
    "small_clip": {
        "image_mean": CLIP_MEAN, "image_std": CLIP_STD, "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 16,
        "image_processor_type": "Qwen2VLImageProcessor",
    },
    # The unfused paths: rescale without normalize, normalize without rescale.
    "rescale_only": {
        "do_normalize": False, "patch_size": 16, "merge_size": 2, "size": {"shortest_edge": 1024, "longest_edge": 16384},
    },
    "normalize_only": {
        "do_rescale": False, "image_mean": [127.5, 120.25, 100.0], "image_std": [60.0, 64.5, 70.3], "patch_size": 16,
        "merge_size": 2, "size": {"shortest_edge": 1024, "longest_edge": 16384},
    },
    # Qwen/Qwen3-VL-2B-Instruct preprocessor_config.json (Qwen3.5 ships the same values).
    "qwen3_vl": {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16, "temporal_patch_size": 2,
        "merge_size": 2, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
    },
}


def noise(h: int, w: int, seed: int) -> np.ndarray:
    """uint8 [h, w, 3]: byte i is the low byte of splitmix64(i + seed * 0x9E3779B97F4A7C15)."""
    with np.errstate(over="ignore"):
        x = np.arange(h * w * 3, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x & np.uint64(255)).astype(np.uint8).reshape(h, w, 3)


def scene(h: int, w: int, seed: int, grain: float = 6.0) -> np.ndarray:
    """A photo-like uint8 [h, w, 3]: gradients, a few shapes, mild grain."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    base = np.stack([40 + 180 * x / max(w - 1, 1), 60 + 150 * y / max(h - 1, 1), 120 + 80 * np.sin((x + y) / 9)], -1)
    im = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(im)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(2, max(3, w // 2))), y0 + int(rng.integers(2, max(3, h // 2)))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (d.ellipse if rng.random() < 0.5 else d.rectangle)([x0, y0, x1, y1], fill=color)
    a = np.asarray(im).astype(np.float64) + rng.normal(0, grain, (h, w, 3))
    return np.clip(np.round(a), 0, 255).astype(np.uint8)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def write_png(path: Path, w: int, h: int, bit_depth: int, color_type: int, rows: list[bytes], extra: bytes = b"") -> None:
    """A PNG written by hand, for what pillow does not write (16-bit RGB, a tRNS colour key)."""
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0)
    idat = zlib.compress(b"".join(b"\x00" + r for r in rows), 9)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b""))


def exif_orientation(value: int) -> bytes:
    ex = Image.Exif()
    ex[0x0112] = value
    return ex.tobytes()


def make_images() -> list[Path]:
    d = OUT / "images"
    d.mkdir(parents=True, exist_ok=True)
    for p in d.iterdir():
        p.unlink()
    paths = []

    def save(name: str, im: Image.Image, **kw) -> None:
        im.save(d / name, **kw)
        paths.append(d / name)

    save("rgb.png", Image.fromarray(scene(67, 101, 1)), optimize=True)
    rgba = np.dstack([scene(70, 90, 2), np.tile(np.linspace(0, 255, 90).astype(np.uint8), (70, 1))])
    rgba[:6, :, 3] = 0
    save("rgba.png", Image.fromarray(rgba, "RGBA"), optimize=True)
    save("gray.png", Image.fromarray(scene(50, 75, 3)[..., 1], "L"), optimize=True)
    la = np.dstack([scene(30, 40, 4)[..., 0], np.tile(np.linspace(255, 0, 40).astype(np.uint8), (30, 1))])
    save("gray_alpha.png", Image.fromarray(la, "LA"), optimize=True)
    pal = Image.fromarray(scene(48, 64, 5, grain=0)).quantize(24)
    save("palette.png", pal, optimize=True)
    # A single fully transparent palette index: load_image's convert("RGB") keeps it as a colour key, and the
    # processor's convert_to_rgb paints every pixel of that colour white.
    save("palette_trns.png", pal, transparency=int(np.asarray(pal)[20, 30]))
    rgb8 = scene(21, 33, 6)
    key = rgb8[10, 10].tolist()
    write_png(d / "rgb_trns.png", 33, 21, 8, 2, [r.tobytes() for r in rgb8], png_chunk(b"tRNS", struct.pack(">HHH", *key)))
    paths.append(d / "rgb_trns.png")
    rgb16 = (scene(21, 33, 7).astype(np.uint16) * 257 + np.random.default_rng(7).integers(0, 257, (21, 33, 3))).astype(">u2")
    write_png(d / "rgb16.png", 33, 21, 16, 2, [r.tobytes() for r in rgb16])
    paths.append(d / "rgb16.png")
    g16 = np.random.default_rng(8).integers(0, 400, (21, 33)).astype(">u2")  # pillow clips 16-bit grey at 255
    write_png(d / "gray16.png", 33, 21, 16, 0, [r.tobytes() for r in g16])
    paths.append(d / "gray16.png")

    photo = Image.fromarray(scene(77, 123, 9))
    save("jpeg_420.jpg", photo, quality=90, subsampling=2)
    save("jpeg_444.jpg", photo, quality=95, subsampling=0)
    save("jpeg_progressive.jpg", Image.fromarray(scene(77, 123, 10)), quality=85, progressive=True)
    save("jpeg_gray.jpg", Image.fromarray(scene(45, 61, 11)[..., 2], "L"), quality=90)
    save("jpeg_cmyk.jpg", Image.fromarray(scene(40, 52, 12)).convert("CMYK"), quality=90)
    save("jpeg_exif6.jpg", Image.fromarray(scene(40, 60, 13)), quality=90, exif=exif_orientation(6))

    save("webp_lossless.webp", Image.fromarray(scene(45, 70, 14)), lossless=True)
    save("webp_lossy.webp", Image.fromarray(scene(45, 70, 15)), quality=80)
    wa = np.dstack([scene(36, 50, 16), np.tile(np.linspace(0, 255, 50).astype(np.uint8), (36, 1))])
    save("webp_alpha.webp", Image.fromarray(wa, "RGBA"), lossless=True)
    save("webp_exif3.webp", Image.fromarray(scene(30, 44, 17)), lossless=True, exif=exif_orientation(3))

    tiny = scene(3, 5, 18, grain=30)
    for o in range(2, 9):
        save(f"exif{o}.png", Image.fromarray(tiny), exif=exif_orientation(o))

    save("wide.png", Image.fromarray(scene(31, 930, 19)), optimize=True)
    save("tiny.png", Image.fromarray(scene(9, 12, 20)), optimize=True)
    save("large.png", Image.fromarray(scene(300, 400, 21, grain=2)), optimize=True)
    return paths


def sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def unpatchify_u8(pv: torch.Tensor, grid: list[int], cfg: dict) -> np.ndarray:
    """The resized uint8 image [h, w, 3] back from pixel_values computed without rescale / normalize."""
    p, m, t = cfg["patch_size"], cfg["merge_size"], cfg["temporal_patch_size"]
    _, gh, gw = grid
    x = pv.reshape(gh // m, gw // m, m, m, 3, t, p, p)[:, :, :, :, :, 0]
    x = x.permute(0, 2, 5, 1, 3, 6, 4)  # [bh, mh, py, bw, mw, px, c]
    return x.reshape(gh * p, gw * p, 3).numpy().astype(np.uint8)


def run_case(pil: Image.Image, cfg: dict) -> tuple[dict, np.ndarray]:
    cfg = {k: v for k, v in cfg.items() if k not in ("processor_class", "image_processor_type")}
    proc = Qwen2VLImageProcessor(**cfg)
    out = proc(images=[pil], return_tensors="pt")
    pv = out["pixel_values"]
    assert pv.dtype == torch.float32, pv.dtype
    grid = out["image_grid_thw"][0].tolist()
    raw = proc(images=[pil], do_rescale=False, do_normalize=False, return_tensors="pt")["pixel_values"]
    resized = unpatchify_u8(raw, grid, {**{"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}, **cfg})
    pil_pv = Qwen2VLImageProcessorPil(**cfg)(images=[pil], return_tensors="pt")["pixel_values"]
    case = {
        "grid_thw": grid,
        "resized": list(resized.shape[:2]),
        "pixel_sha256": sha256(pv.numpy().astype("<f4")),
        "resized_sha256": sha256(resized),
        "pil_max_abs_diff": float((pil_pv - pv).abs().max()),
    }
    return case, pv.numpy().astype("<f4")


def resize_cases() -> list[dict]:
    sizes = [
        ((67, 101), (64, 96)), ((77, 123), (32, 128)), ((30, 900), (16, 480)), ((20, 20), (64, 64)),
        ((300, 200), (150, 100)), ((768, 1024), (448, 448)), ((1, 1), (5, 7)), ((1, 37), (3, 11)),
        ((9, 12), (32, 64)), ((301, 7), (13, 13)), ((50, 50), (50, 23)), ((50, 50), (23, 50)),
        ((13, 400), (77, 19)), ((255, 3), (2, 9)), ((640, 480), (224, 224)), ((33, 33), (32, 32)),
        ((31, 31), (32, 32)), ((600, 40), (7, 40)), ((100, 100), (99, 101)), ((5, 500), (64, 64)),
    ]
    cases = []
    for seed, ((h, w), (oh, ow)) in enumerate(sizes):
        x = torch.from_numpy(noise(h, w, seed)).permute(2, 0, 1)[None].contiguous()
        y = F.interpolate(x, size=[oh, ow], mode="bicubic", align_corners=False, antialias=True)
        assert y.dtype == torch.uint8
        cases.append({"in": [h, w], "out": [oh, ow], "seed": seed, "sha256": sha256(y[0].permute(1, 2, 0).numpy())})
    return cases


def smart_resize_table() -> list[list]:
    args = []
    for factor in (28, 32):
        for mn, mx in ((56 * 56, 28 * 28 * 1280), (65536, 16777216), (32 * 32, 64 * 64 * 4)):
            for h, w in ((48, 80), (16, 16), (80, 48), (112, 144), (1, 1), (1, 200), (1, 201), (2, 401), (3, 600),
                         (10, 2000), (14, 14), (42, 70), (1080, 1920), (4000, 3000), (123, 77), (7000, 7000),
                         (25000, 125), (77, 15400), (333, 777), (4096, 4096), (4097, 4096), (30, 900)):
                args.append((h, w, factor, mn, mx))
    # Halves (x.5 ties round to even in Python's round()): h / factor = k + 0.5.
    for k in range(0, 8):
        args.append((16 * (2 * k + 1), 16 * (2 * k + 3), 32, 32 * 32, 64 * 64 * 64))
        args.append((14 * (2 * k + 1), 700, 28, 28 * 28, 28 * 28 * 64))
    rng = np.random.default_rng(5)
    for _ in range(40):
        h, w = int(rng.integers(1, 5000)), int(rng.integers(1, 5000))
        args.append((h, w, int(rng.choice([28, 32])), int(rng.integers(1, 200000)), int(rng.integers(200000, 20000000))))
    table = []
    for h, w, f, mn, mx in args:
        try:
            rh, rw = smart_resize(h, w, factor=f, min_pixels=mn, max_pixels=mx)
            table.append([h, w, f, mn, mx, rh, rw])
        except ValueError:
            table.append([h, w, f, mn, mx, "error"])
    return table


def main() -> None:
    paths = make_images()
    (OUT / "decoded").mkdir(parents=True, exist_ok=True)
    for p in (OUT / "decoded").iterdir():
        p.unlink()
    images = []
    for path in paths:
        name = path.stem
        pil = load_image(str(path))
        decoded = np.asarray(convert_to_rgb(pil, return_numpy=True))
        if name.startswith("jpeg") or name == "webp_lossy":  # decoders may differ: keep pillow's pixels
            Image.fromarray(decoded, "RGB").save(OUT / "decoded" / f"{name}.png", optimize=True)
        tv = load_image_as_tensor(str(path)).permute(1, 2, 0).numpy()
        entry = {
            "name": name,
            "file": f"images/{path.name}",
            "size": list(decoded.shape[:2]),
            "decoded_sha256": sha256(decoded),
            "torchvision_decode_equal": bool(tv.dtype == np.uint8 and tv.shape == decoded.shape and (tv == decoded).all()),
            "cases": {},
        }
        for setting, cfg in SETTINGS.items():
            case, pv = run_case(pil, cfg)
            entry["cases"][setting] = case
            if name == "tiny" and setting == "small":
                (OUT / "tiny.small.pixels.bin").write_bytes(pv.tobytes())
        images.append(entry)
        print(name, entry["size"], {k: (v["grid_thw"], v["pil_max_abs_diff"]) for k, v in entry["cases"].items()},
              "tv-decode-equal" if entry["torchvision_decode_equal"] else "tv-decode-DIFFERS")
    manifest = {"settings": SETTINGS, "images": images, "resize_cases": resize_cases(), "smart_resize": smart_resize_table()}
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"{OUT}: {total} bytes")


if __name__ == "__main__":
    main()
