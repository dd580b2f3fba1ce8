#!/usr/bin/env python3
"""Writes a random-weight copy of a sentence-transformers BERT folder (same config, tokenizer and
pipeline files; matrices drawn by transformers' own initializer, seed 0) for speed runs on a
machine the real weights cannot travel to (the lent device machine: 64 MiB per call).

  python3 scripts/device/make_random_encoder.py SRC_FOLDER OUT_FOLDER

SRC_FOLDER needs config.json and the tokenizer / sentence-transformers files, not the weights.
Speed does not depend on the values; accuracy figures come from the real model elsewhere.
"""

import shutil
import sys
from pathlib import Path

import torch
from transformers import BertConfig, BertModel


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    torch.manual_seed(0)
    model = BertModel(BertConfig.from_pretrained(str(src)), add_pooling_layer=False).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for f in src.rglob("*"):
        rel = f.relative_to(src)
        if f.is_file() and str(rel) not in ("config.json", "model.safetensors"):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, out / rel)
    n = sum(p.numel() for p in model.parameters())
    print(f"{out}: random BERT, {n / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main()
