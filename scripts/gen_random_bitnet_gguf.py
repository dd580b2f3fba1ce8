#!/usr/bin/env python3
"""Writes a random-weight BitNet b1.58 GGUF of the microsoft/bitnet-b1.58-2B-4T shape (30 layers,
hidden 2560, FFN 6912, 20 query / 5 key-value heads, vocab 128,256, tied embeddings) for speed
runs: llama.cpp (arch `bitnet`) and Lattice read the very same file.

The projections are TQ2_0 (or TQ1_0) blocks of random ternary codes with one scale per tensor;
the embedding table, also the output head, is Q4_K as llama-quantize makes it for the TQ file
types (random blocks with small scales); norms are F32; the tokenizer metadata is copied from
llama.cpp's Llama 3 vocabulary file (models/ggml-vocab-llama-bpe.gguf, 128,256 tokens). Speed
does not depend on the values. No real 2B4T weights are reachable from here.

  .cache/venv-ref/bin/python scripts/gen_random_bitnet_gguf.py [--type tq2_0|tq1_0] [--out FILE]

Needs scripts/setup_reference_env.sh (gguf, numpy) and scripts/build_llama_cpp.sh (its source
tree holds the vocabulary file).
Default output: .cache/models/bitnet-2b4t-random.<type>.gguf.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ROOT / ".cache" / "llama.cpp" / "src"
import gguf  # noqa: E402  (PyPI gguf, in .cache/venv-ref)

ARCH = "bitnet"
LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, VOCAB = 30, 2560, 6912, 20, 5, 128256


def tq_bytes(rng: np.random.Generator, rows: int, cols: int, qtype: str, scale: float) -> np.ndarray:
    """Random ternary blocks: [rows, cols/256 * block bytes] uint8."""
    nb = rows * cols // 256
    d = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    if qtype == "tq2_0":
        codes = rng.integers(0, 3, size=(nb, 64, 4), dtype=np.uint8)
        qs = codes[..., 0] | (codes[..., 1] << 2) | (codes[..., 2] << 4) | (codes[..., 3] << 6)
        blocks = np.concatenate([qs, np.broadcast_to(d, (nb, 2))], axis=1)
    else:
        # Any byte holds a valid set of base-3 digits once rounded as llama.cpp does; random
        # ternary digits encoded as fractions of 256 (5 per byte in qs, 4 in qh).
        digits = rng.integers(0, 3, size=(nb, 52, 5), dtype=np.uint16)
        q = np.zeros((nb, 52), dtype=np.uint16)
        for n in range(5):
            q = q * 3 + digits[..., n]
        q[:, 48:] = (q[:, 48:] // 3) * 3  # qh: 4 digits, the fifth zero
        qs = ((q * 256 + 242) // 243).astype(np.uint8)
        blocks = np.concatenate([qs, np.broadcast_to(d, (nb, 2))], axis=1)
    return np.ascontiguousarray(blocks.reshape(rows, -1))


def q4k_bytes(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Random Q4_K blocks (144 bytes per 256 values) with small f16 scales."""
    nb = rows * cols // 256
    blocks = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    scales = np.frombuffer(np.array([0.002, 0.001], dtype=np.float16).tobytes(), dtype=np.uint8)
    blocks[:, :4] = scales
    return blocks.reshape(rows, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--type", default="tq2_0", choices=["tq2_0", "tq1_0"])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--layers", type=int, default=LAYERS)
    args = ap.parse_args()
    out = args.out or ROOT / ".cache" / "models" / f"bitnet-2b4t-random.{args.type}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    qtype = gguf.GGMLQuantizationType.TQ2_0 if args.type == "tq2_0" else gguf.GGMLQuantizationType.TQ1_0

    vocab = gguf.GGUFReader(str(LLAMA / "models" / "ggml-vocab-llama-bpe.gguf"))
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("bitnet-b1.58-2B-4T-shaped random weights")
    w.add_block_count(args.layers)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(500000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_TQ2_0 if args.type == "tq2_0" else gguf.LlamaFileType.MOSTLY_TQ1_0)
    for field in vocab.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(field.name, value, vtype, sub_type=field.types[-1])
        else:
            w.add_key_value(field.name, value, vtype)

    rng = np.random.default_rng(7)
    f32 = lambda n, c: (c + 0.1 * rng.standard_normal(n)).astype(np.float32)  # noqa: E731
    w.add_tensor("token_embd.weight", q4k_bytes(rng, VOCAB, HIDDEN), raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    w.add_tensor("output_norm.weight", f32(HIDDEN, 1.0))
    kv = HIDDEN // HEADS * KV_HEADS
    for i in range(args.layers):
        for name, n in [("attn_norm", HIDDEN), ("attn_sub_norm", HIDDEN), ("ffn_norm", HIDDEN), ("ffn_sub_norm", FFN)]:
            w.add_tensor(f"blk.{i}.{name}.weight", f32(n, 1.0))
        for name, rows, cols in [("attn_q", HIDDEN, HIDDEN), ("attn_k", kv, HIDDEN), ("attn_v", kv, HIDDEN),
                                 ("attn_output", HIDDEN, HIDDEN), ("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN),
                                 ("ffn_down", HIDDEN, FFN)]:
            scale = float(0.5 + rng.random())
            w.add_tensor(f"blk.{i}.{name}.weight", tq_bytes(rng, rows, cols, args.type, scale), raw_dtype=qtype)
        print(f"layer {i + 1}/{args.layers}", file=sys.stderr, end="\r")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
