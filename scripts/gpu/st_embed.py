#!/usr/bin/env python3
"""sentence-transformers embedding throughput on the GPU (fp16 by default), with a parity dump.

  python3 scripts/gpu/st_embed.py --model DIR --sentences FILE [--batch 128] [--runs 5]
      [--dtype fp16|f32] [--dump FILE.json] [--device cuda]

--sentences: a text file, one sentence per line (empty lines dropped), or an STS-B style csv
(sentence1, sentence2, score: every unique sentence, sentence1 then sentence2 of each row, first
occurrence kept, header skipped: the workload of scripts/bench_embed.sh and scripts/bench_ort.py,
2,910 sentences for stsb-en-dev.csv). --limit N keeps the first N.

Timed: model.encode(sentences, batch_size=--batch, convert_to_tensor=True) over all sentences,
which includes sentence-transformers' own tokenization, its length-sorted batching, padding to the
longest text of each batch, the fp16 forward, pooling and normalization, with
torch.cuda.synchronize() after it. One untimed warm-up pass, then --runs timed passes;
sentences_per_s = count / median seconds. Tokenization alone (model.preprocess over the same
batches, in file order) is timed separately and reported as tokenize_s, so a figure without it can be estimated.

--dump FILE: the embeddings of the first --dump-n (64) sentences as f32 lists (computed in --dtype,
as encode returns them: normalized if the model has a Normalize module), with the sentences.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def read_sentences(path: Path) -> list[str]:
    if path.suffix.lower() == ".csv":
        seen: set[str] = set()
        out: list[str] = []
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.reader(f):
                if len(row) < 3:
                    continue
                try:
                    float(row[2])
                except ValueError:  # header line
                    continue
                for s in row[:2]:
                    if s not in seen:
                        seen.add(s)
                        out.append(s)
        return out
    return [line.rstrip("\r\n") for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="sentence-transformers folder")
    ap.add_argument("--sentences", type=Path, required=True)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dtype", choices=["fp16", "f32"], default="fp16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N sentences (0: all)")
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument("--dump-n", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="also write the result JSON here")
    args = ap.parse_args()

    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: pass --device cpu")
    sentences = read_sentences(args.sentences)
    if args.limit > 0:
        sentences = sentences[: args.limit]
    if not sentences:
        raise SystemExit(f"no sentences in {args.sentences}")

    model = SentenceTransformer(str(args.model), device=args.device)
    if args.dtype == "fp16":
        model.half()
    else:
        model.float()  # transformers 5 loads in the checkpoint's dtype (F16 for prepare_carry's copy)
    model.eval()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def encode(xs):
        with torch.inference_mode():
            return model.encode(xs, batch_size=args.batch, convert_to_tensor=True, show_progress_bar=False)

    sync()
    t = time.perf_counter()
    encode(sentences)  # warm-up (kernel selection, allocator)
    sync()
    warm_s = time.perf_counter() - t
    times = []
    for _ in range(args.runs):
        sync()
        t = time.perf_counter()
        emb = encode(sentences)
        sync()
        times.append(time.perf_counter() - t)
    med = statistics.median(times)

    prep = getattr(model, "preprocess", None) or model.tokenize  # tokenize: before sentence-transformers 6
    t = time.perf_counter()
    n_tokens = 0
    n_padded = 0
    for i in range(0, len(sentences), args.batch):
        feats = prep(sentences[i : i + args.batch])
        n_tokens += int(feats["attention_mask"].sum())
        n_padded += int(feats["attention_mask"].numel())
    tok_s = time.perf_counter() - t

    result = {
        "engine": "sentence-transformers",
        "model": str(args.model),
        "sentences_file": str(args.sentences),
        "sentences": len(sentences),
        "batch": args.batch,
        "dtype": args.dtype,
        "device": args.device,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "max_seq_length": model.max_seq_length,
        "embedding_dim": int(emb.shape[1]),
        "runs": args.runs,
        "sentences_per_s": len(sentences) / med,
        "median_s": med,
        "samples_s": [round(x, 5) for x in times],
        "warmup_s": round(warm_s, 4),
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / med,
        "tokenize_s": tok_s,
        "note": "timed encode() includes tokenization; tokens counts non-padding tokens with in-file-order "
                "batches (encode sorts by length, so its padding is smaller than in-order batching)",
    }
    if cuda:
        result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)

    if args.dump:
        first = sentences[: args.dump_n]
        vecs = encode(first).float().cpu()
        args.dump.parent.mkdir(parents=True, exist_ok=True)
        body = ",".join(
            '{"text": ' + json.dumps(s, ensure_ascii=False) + ', "embedding": ['
            + ",".join(str(x) for x in vecs[i].numpy()) + "]}"
            for i, s in enumerate(first)
        )
        args.dump.write_text('{"model": ' + json.dumps(str(args.model)) + ', "dtype": ' + json.dumps(args.dtype)
                             + ', "device": ' + json.dumps(args.device) + ', "items": [' + body + "]}\n",
                             encoding="utf-8")
        json.loads(args.dump.read_text(encoding="utf-8"))  # well-formed
        result["dump"] = str(args.dump)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"st_embed: {len(sentences)} sentences, {result['sentences_per_s']:.1f} sentences/s", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
