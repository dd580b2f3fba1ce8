#!/usr/bin/env python3
"""Exports the real models' transformers to ONNX for the ONNX Runtime speed peer (scripts/bench_ort.py).

For each model in .cache/models/ writes .cache/onnx/<model>.onnx (git-ignored): the bare encoder
(BertModel / MPNetModel) in f32, opset 17, inputs input_ids, attention_mask (+ token_type_ids for
BERT) with dynamic batch and sequence axes, single output last_hidden_state [batch, seq, hidden].
Pooling and normalization are not in the graph (bench_ort.py does them in numpy, like ST).

Uses the TorchScript exporter (dynamo=False; no onnxscript needed) with eager attention, then checks
the ONNX Runtime output against PyTorch on a padded batch (max |diff| must be < 1e-4).

Usage: .cache/venv-ref/bin/python scripts/export_onnx.py [--model all-MiniLM-L6-v2 ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"
ONNX_DIR = ROOT / ".cache" / "onnx"
OPSET = 17
MODEL_NAMES = ["all-MiniLM-L6-v2", "all-mpnet-base-v2"]


class LastHidden(torch.nn.Module):
    """Wraps the encoder so that the graph has exactly the inputs and the one output we want."""

    def __init__(self, model, with_token_types: bool):
        super().__init__()
        self.model = model
        self.with_token_types = with_token_types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.with_token_types:
            kw["token_type_ids"] = token_type_ids
        return self.model(**kw, return_dict=True).last_hidden_state


def export(name: str) -> Path:
    import onnx
    import onnxruntime as ort
    from transformers import AutoModel, AutoTokenizer

    src = MODELS / name
    model = AutoModel.from_pretrained(str(src), attn_implementation="eager", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(src))
    with_tt = model.config.model_type == "bert"
    wrapped = LastHidden(model, with_tt).eval()
    texts = ["A short one.", "A somewhat longer sentence, so that the batch needs padding on the first row."]
    enc = tok(texts, padding=True, truncation=True, return_tensors="pt")
    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if with_tt else [])
    args = tuple(enc[n] for n in names)
    dyn = {n: {0: "batch", 1: "sequence"} for n in names}
    dyn["last_hidden_state"] = {0: "batch", 1: "sequence"}
    ONNX_DIR.mkdir(parents=True, exist_ok=True)
    out = ONNX_DIR / f"{name}.onnx"
    t0 = time.time()
    with torch.no_grad():
        torch.onnx.export(
            wrapped,
            args,
            str(out),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=dyn,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
            external_data=False,
        )
    onnx.checker.check_model(str(out))
    print(f"{name}: exported {out.relative_to(ROOT)} ({out.stat().st_size / 1e6:.1f} MB, {time.time() - t0:.0f} s)")

    # Verify against PyTorch on texts of other lengths than the export example (dynamic axes).
    check = [
        "",
        "Hello world!",
        "The quick brown fox jumps over the lazy dog, and then some more words to make it longer.",
        "東京は日本の首都です。 🍕",
    ]
    max_len = json.loads((src / "sentence_bert_config.json").read_text())["max_seq_length"]
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    diff = 0.0
    for batch in (check, ["a long one " * 400]):  # padded batch; batch of 1 at max_seq_length
        enc = tok(batch, padding=True, truncation=True, max_length=max_len, return_tensors="np")
        feeds = {n: enc[n].astype(np.int64) for n in names}
        got = sess.run(["last_hidden_state"], feeds)[0]
        with torch.no_grad():
            ref = wrapped(*(torch.from_numpy(feeds[n]) for n in names)).numpy()
        mask = enc["attention_mask"].astype(bool)
        diff = max(diff, float(np.abs(got - ref)[mask].max()))
    print(f"{name}: ONNX vs PyTorch last_hidden_state max |diff| over real tokens = {diff:.3g}")
    assert diff < 1e-4, diff
    meta = {"model": name, "opset": OPSET, "inputs": names, "output": "last_hidden_state", "max_abs_diff": diff}
    (ONNX_DIR / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="folder under .cache/models (default: both real models)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    for name in args.model or MODEL_NAMES:
        export(name)


if __name__ == "__main__":
    main()
