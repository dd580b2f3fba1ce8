#!/usr/bin/env python3
"""ONNX Runtime side of the embedding speed comparison (CPU).

  .cache/venv-ref/bin/python scripts/bench_ort.py --model all-MiniLM-L6-v2 \
      --data /work/shared/data/stsb/stsb-en-dev.csv --threads 2 --batch 32 --runs 5

Needs .cache/onnx/<model>.onnx from scripts/export_onnx.py. With --int8 the peer is ONNX
Runtime's own dynamic int8 quantization of that export (`quantize_dynamic`, int8 weights per
output channel, activations quantized per tensor at run time; written once to
.cache/onnx/<model>.int8.onnx), the int8 counterpart of `lattice bench --q8`. Workload: every unique sentence of the
csv (sentence1, sentence2, score; sentence1 then sentence2 of each row, first occurrence kept), in
that order, in batches of --batch. Tokenization uses the model's HF tokenizer like
sentence-transformers: truncation to max_seq_length, padding to the longest text of each batch.

--accuracy times nothing: it embeds every sentence with the session (e.g. --int8) and with the f32
export and prints one JSON line with the max / mean 1 - cos between them and the STS-B Spearman
(x 100) of both on the csv's pairs.

Timed (throughput): session.run + mean pooling + L2 normalization in numpy, per batch, all batches;
repeated --runs times after one warm-up pass. Tokenization is done once up front and is EXCLUDED
from sentences/s and tokens/s; its own time is reported as tokenize_s. Latency: batch 1 over the
first --latency-n sentences (same timed region), after a short warm-up.

tokens/s counts real (non-padding) tokens, specials included; padded_tokens_per_s counts what was
actually computed. The last stdout line is one JSON object with all figures (with the 1-minute load
average at start and end, since the machine may be shared).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / ".cache" / "models"
ONNX_DIR = ROOT / ".cache" / "onnx"


def read_sentences(path: Path) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.reader(f):
            try:
                float(row[2])
            except ValueError:  # header line
                continue
            for s in row[:2]:
                if s not in seen:
                    seen.add(s)
                    out.append(s)
    return out


def embed(sess, feeds: dict, mask: np.ndarray) -> np.ndarray:
    hidden = sess.run(["last_hidden_state"], feeds)[0]  # f32 [batch, seq, hidden]
    m = mask[:, :, None].astype(np.float32)
    pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
    return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="folder name under .cache/models, e.g. all-MiniLM-L6-v2")
    ap.add_argument("--data", type=Path, required=True, help="STS-B style csv")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--latency-n", type=int, default=200, help="sentences for the batch-1 latency")
    ap.add_argument("--int8", action="store_true", help="ONNX Runtime's dynamic int8 quantization")
    ap.add_argument("--accuracy", action="store_true",
                    help="no timing: the session's embeddings of every sentence against the f32 "
                         "export's (1 - cos) and the STS-B Spearman (x 100) of both")
    args = ap.parse_args()

    import onnxruntime as ort
    from transformers import AutoTokenizer

    load_start = os.getloadavg()[0]  # the machine is shared: kept in the result to flag noisy runs

    src = MODELS / args.model
    onnx_path = ONNX_DIR / f"{args.model}.onnx"
    if not onnx_path.exists():
        raise SystemExit(f"missing {onnx_path}: run scripts/export_onnx.py first")
    if args.int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        q_path = ONNX_DIR / f"{args.model}.int8.onnx"
        if not q_path.exists():
            quantize_dynamic(str(onnx_path), str(q_path), weight_type=QuantType.QInt8,
                             per_channel=True)
        onnx_path = q_path
    max_len = json.loads((src / "sentence_bert_config.json").read_text())["max_seq_length"]
    tok = AutoTokenizer.from_pretrained(str(src))

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    input_names = [i.name for i in sess.get_inputs()]

    def encode(texts):
        enc = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="np")
        feeds = {n: enc[n].astype(np.int64) for n in input_names}
        return feeds, enc["attention_mask"]

    # Sanity: pooled ORT embeddings vs the committed sentence-transformers reference, if present.
    ref_path = ROOT / "crates" / "embed" / "tests" / "fixtures" / "real" / f"{args.model}.json"
    check = None
    if ref_path.exists():
        ref = json.loads(ref_path.read_text(encoding="utf-8"))
        got = np.concatenate([embed(sess, *encode(ref["texts"][i : i + 8])) for i in range(0, len(ref["texts"]), 8)])
        check = float(np.abs(got - np.array(ref["embeddings"], dtype=np.float32)).max())
        print(f"check: ORT vs sentence-transformers reference ({len(ref['texts'])} texts) max |diff| = {check:.3g}")

    sentences = read_sentences(args.data)
    if args.accuracy:
        f32_sess = ort.InferenceSession(str(ONNX_DIR / f"{args.model}.onnx"), so,
                                        providers=["CPUExecutionProvider"])
        vecs = {}
        for name, s_ in (("f32", f32_sess), ("session", sess)):
            vecs[name] = np.concatenate([embed(s_, *encode(sentences[i : i + args.batch]))
                                         for i in range(0, len(sentences), args.batch)])
        gap = 1.0 - (vecs["f32"].astype(np.float64) * vecs["session"]).sum(1)
        index = {t: i for i, t in enumerate(sentences)}
        rows = [r for r in csv.reader(open(args.data, newline="", encoding="utf-8"))]
        pairs = []
        for r in rows:
            try:
                pairs.append((index[r[0]], index[r[1]], float(r[2])))
            except (ValueError, KeyError):
                continue

        def spearman(v):
            from scipy.stats import spearmanr

            cos = [float(v[a] @ v[b]) for a, b, _ in pairs]
            return 100.0 * spearmanr(cos, [g for _, _, g in pairs]).statistic

        print(json.dumps({
            "engine": "onnxruntime", "weights": "int8 (quantize_dynamic)" if args.int8 else "f32",
            "model": args.model, "sentences": len(sentences), "pairs": len(pairs),
            "max_1_minus_cos": float(gap.max()), "mean_1_minus_cos": float(gap.mean()),
            "spearman": spearman(vecs["session"]), "spearman_f32": spearman(vecs["f32"]),
        }))
        return
    t0 = time.perf_counter()
    batches = [encode(sentences[i : i + args.batch]) for i in range(0, len(sentences), args.batch)]
    tokenize_s = time.perf_counter() - t0
    n_tokens = int(sum(m.sum() for _, m in batches))
    n_padded = int(sum(m.size for _, m in batches))
    print(
        f"{args.model}: {len(sentences)} sentences, {len(batches)} batches of {args.batch}, "
        f"{n_tokens} tokens ({n_padded} with padding), max_seq_length {max_len}; tokenize {tokenize_s:.2f} s"
    )

    for feeds, mask in batches:  # warm-up pass
        embed(sess, feeds, mask)
    times = []
    for r in range(args.runs):
        t0 = time.perf_counter()
        for feeds, mask in batches:
            embed(sess, feeds, mask)
        times.append(time.perf_counter() - t0)
        print(f"  run {r + 1}/{args.runs}: {times[-1]:.2f} s, {len(sentences) / times[-1]:.1f} sentences/s")

    singles = [encode([s]) for s in sentences[: args.latency_n]]
    for feeds, mask in singles[:10]:
        embed(sess, feeds, mask)
    lat = []
    for feeds, mask in singles:
        t0 = time.perf_counter()
        embed(sess, feeds, mask)
        lat.append((time.perf_counter() - t0) * 1e3)
    lat.sort()

    t_med = statistics.median(times)
    result = {
        "engine": "onnxruntime",
        "ort_version": ort.__version__,
        "weights": "int8 (quantize_dynamic)" if args.int8 else "f32",
        "model": args.model,
        "threads": args.threads,
        "batch": args.batch,
        "runs": args.runs,
        "n_sentences": len(sentences),
        "n_tokens": n_tokens,
        "sentences_per_s_median": len(sentences) / t_med,
        "sentences_per_s_min": len(sentences) / max(times),
        "sentences_per_s_max": len(sentences) / min(times),
        "tokens_per_s_median": n_tokens / t_med,
        "padded_tokens_per_s_median": n_padded / t_med,
        "latency_ms_median": statistics.median(lat),
        "latency_ms_p90": lat[min(len(lat) - 1, int(0.9 * len(lat)))],
        "latency_n": len(lat),
        "tokenize_s": tokenize_s,
        "tokenization": "excluded (done once before timing; tokenize_s is its time for all sentences)",
        "check_max_abs_diff": check,
        "loadavg_1m_start": load_start,
        "loadavg_1m_end": os.getloadavg()[0],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
