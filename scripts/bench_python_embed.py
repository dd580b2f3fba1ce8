#!/usr/bin/env python3
"""`lattice.Embedder.embed` vs sentence-transformers' `SentenceTransformer.encode` in one process,
same model folder, same sentences, same threads, alternating runs; prints the medians and ratio.

    .cache/venv-ref/bin/pip install /tmp/wheels/lattice-*.whl sentence-transformers
    .cache/venv-ref/bin/python scripts/bench_python_embed.py .cache/models/all-MiniLM-L6-v2 [--n 1500] [--runs 3] [--threads 2]
"""
import argparse
import csv
import pathlib
import platform
import statistics
import time

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

import lattice

ROOT = pathlib.Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def sentences(n: int) -> list:
    path = ROOT.parent / "shared" / "data" / "stsb" / "stsb-en-dev.csv"
    out = []
    with open(path) as f:
        for row in csv.reader(f):
            out.extend(row[:2])
    return out[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    texts = sentences(a.n)
    st = SentenceTransformer(a.model, device="cpu")
    lt = lattice.Embedder(a.model, threads=a.threads)
    want = st.encode(texts[:64], batch_size=32)
    got = lt.encode(texts[:64], batch_size=32)
    cos = (want * got).sum(1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    times = {"lattice": [], "sentence-transformers": []}
    for _ in range(a.runs):
        t0 = time.perf_counter()
        lt.embed(texts)
        times["lattice"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        st.encode(texts, batch_size=32)
        times["sentence-transformers"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"CPU: {cpu_model()}; Lattice ISA {lattice.cpu_isa()}; torch {torch.__version__}; "
          f"{a.threads} threads; {len(texts)} sentences; {a.runs} runs; max 1-cos {1 - cos.min():.1e}")
    for k, v in times.items():
        print(f"{k}: {len(texts) / med[k]:.0f} sentences/s (runs: {', '.join(f'{len(texts) / x:.0f}' for x in v)})")
    print(f"ratio lattice / sentence-transformers: {med['sentence-transformers'] / med['lattice']:.2f}x")


if __name__ == "__main__":
    main()
