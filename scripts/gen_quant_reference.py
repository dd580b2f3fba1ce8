#!/usr/bin/env python3
"""Writes crates/inference/tests/fixtures/quant/reference.bin.gz: the oracle of
crates/inference/tests/quant.rs for the GGUF block formats.

Dequantization records hold a few real rows of each quantized type found in the two GGUF
models of scripts/fetch_models.sh (SmolLM2-135M Q4_1: Q4_1, Q8_0; Qwen2.5-Coder-0.5B: Q5_0, Q8_0,
Q4_K, Q6_K) plus synthetic rows (Q4_0 made by gguf.quants, F16, BF16, F32), with the values the
`gguf` Python package decodes them to. Quantization records hold random f32 rows and the bytes
gguf.quants.quantize makes of them (Q4_0, Q8_0).

Format (little-endian), gzip-compressed, records until EOF:
    u32 kind (0 = dequantize: bytes then expected f32; 1 = quantize: f32 input then expected bytes)
    u32 ggml_type, u32 rows, u32 k, u32 n_bytes, then n_bytes bytes and rows*k f32 in the order above.

Usage: /work/main/.cache/venv-ref/bin/python scripts/gen_quant_reference.py [models_dir]
"""

import gzip
import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf import quants

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/inference/tests/fixtures/quant/reference.bin.gz"

# (model file, tensor name, rows to take)
REAL = [
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.0.ffn_gate.weight", [0, 777, 1535]),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.3.ffn_down.weight", [5, 300]),
    ("SmolLM2-135M-Instruct.Q4_1.gguf", "token_embd.weight", [0, 1, 12345, 49151]),
    ("Qwen2.5-Coder-0.5B-Instruct.gguf", "blk.0.attn_k.weight", [0, 64, 127]),
    ("Qwen2.5-Coder-0.5B-Instruct.gguf", "blk.0.attn_v.weight", [3, 100]),
    ("Qwen2.5-Coder-0.5B-Instruct.gguf", "blk.0.ffn_down.weight", [0, 895]),
    ("Qwen2.5-Coder-0.5B-Instruct.gguf", "blk.11.ffn_down.weight", [1, 500]),
    ("Qwen2.5-Coder-0.5B-Instruct.gguf", "blk.0.attn_norm.weight", [0]),
]


def record(kind, qtype, rows, k, raw: bytes, values: np.ndarray) -> bytes:
    values = np.ascontiguousarray(values, dtype="<f4")
    assert values.size == rows * k, (values.size, rows, k)
    head = struct.pack("<5I", kind, int(qtype), rows, k, len(raw))
    vals = values.tobytes()
    return head + (raw + vals if kind == 0 else vals + raw)


def dequant_record(qtype, raw_rows: np.ndarray, k: int) -> bytes:
    raw_rows = np.ascontiguousarray(raw_rows)
    expected = quants.dequantize(raw_rows, qtype).astype(np.float32).reshape(-1)
    return record(0, qtype, raw_rows.shape[0], k, raw_rows.view(np.uint8).tobytes(), expected)


def main():
    models = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".cache/models"
    out = []
    readers = {}
    for fname, tname, rows in REAL:
        r = readers.setdefault(fname, GGUFReader(models / fname))
        t = next(t for t in r.tensors if t.name == tname)
        k = int(t.shape[0])
        data = np.asarray(t.data)
        if data.ndim == 1:
            data = data.reshape(1, -1)
        sel = data[rows]
        out.append(dequant_record(t.tensor_type, sel, k))
        print(f"{fname}:{tname} {t.tensor_type.name} k={k} rows={rows}")

    rng = np.random.default_rng(20261129)
    k = 256
    x = rng.standard_normal((4, k)).astype(np.float32)
    x[1, :32] = 0.0  # an all-zero block
    x[2, 32:64] *= 1e-3  # a block of tiny values
    # Synthetic Q4_0 (no model here uses it), F16, BF16.
    out.append(dequant_record(T.Q4_0, quants.quantize(x, T.Q4_0), k))
    out.append(dequant_record(T.F16, x.astype(np.float16).view(np.uint8), k))
    bf = quants.quantize(x, T.BF16)
    out.append(dequant_record(T.BF16, bf, k))
    # Quantization: our quantize_row must produce gguf's bytes.
    for qt in (T.Q4_0, T.Q8_0):
        q = quants.quantize(x, qt)
        out.append(record(1, qt, x.shape[0], k, np.ascontiguousarray(q).tobytes(), x.reshape(-1)))

    OUT.parent.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT, "wb", compresslevel=9, mtime=0) as f:
        f.write(b"".join(out))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
