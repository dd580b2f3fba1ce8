#!/usr/bin/env python3
"""Aggregate decode speed of `lattice serve` with LoRA adapters (issue 16), stdlib only.

Starts the servers itself, alternating: a server without adapters, and one serving the 8
adapters of scripts/gen_lora_bench_adapters.py. Each measurement sends STREAMS concurrent
greedy completions of GEN tokens and reports aggregate generated tokens / wall second:
  base      - server without adapters
  base*     - the adapter server, base-model requests
  8 adapters- one request per adapter (a0..a7)
  1 adapter - every request for a0
  mixture   - every request a `lora` mixture of a0 (0.5) and a1 (0.5)

usage: scripts/bench_lora.py MODEL ADAPTER_ROOT [--runs 2] [--streams 8] [--gen 64] [--threads 2]
       [--bin PATH] [--serve-args "--device cuda --bf16"]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "lattice")


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def start(bin_path, args, port):
    p = subprocess.Popen([bin_path, "serve", "--port", str(port)] + args,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        sys.stderr.write("  | " + line)
        if "listening on" in line:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p
    raise SystemExit("the server did not start")


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def load(port, bodies):
    out = [None] * len(bodies)

    def one(i):
        out[i] = post(port, bodies[i])["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(out) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("adapters")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bin", default=BIN, help="the lattice binary")
    ap.add_argument("--serve-args", default="", help="more `lattice serve` arguments")
    a = ap.parse_args()
    names = [f"a{i}" for i in range(8)]
    lora = []
    for i, n in enumerate(names):
        lora += ["--lora", f"{n}={os.path.join(a.adapters, f'adapter-{i}')}"]
    common = ["--model", a.model, "--threads", str(a.threads), "--no-prefix-cache"] + a.serve_args.split()
    prompt = "Write a function that parses a date in Python."

    def body(model=None, mix=None, k=0):
        b = {"prompt": f"{prompt} ({k})", "max_tokens": a.gen, "temperature": 0,
             "ignore_eos": True}
        if model:
            b["model"] = model
        if mix:
            b["lora"] = mix
        return b

    s = a.streams
    cases = {
        "base": (False, [body(k=k) for k in range(s)]),
        "base*": (True, [body(k=k) for k in range(s)]),
        "8 adapters": (True, [body(names[k % 8], k=k) for k in range(s)]),
        "1 adapter": (True, [body("a0", k=k) for k in range(s)]),
        "mixture": (True, [body(mix=[{"name": "a0", "scale": 0.5}, {"name": "a1", "scale": 0.5}], k=k)
                           for k in range(s)]),
    }
    got = {k: [] for k in cases}
    for run in range(a.runs):
        for with_lora in (False, True):
            port = 18230 + run * 2 + with_lora
            p = start(a.bin, common + (lora if with_lora else []), port)
            try:
                load(port, [body(k=k) for k in range(2)])  # warm-up
                for k, (wl, bodies) in cases.items():
                    if wl == with_lora:
                        got[k].append(load(port, bodies))
                        print(f"run {run}: {k}: {got[k][-1]:.1f} tok/s", file=sys.stderr)
            finally:
                p.terminate()
                p.wait()
    base = statistics.median(got["base"])
    print(f"CPU: {cpu_model()}; {a.threads} threads; {a.serve_args or 'CPU'}; {s} streams x "
          f"{a.gen} tokens; {a.runs} runs")
    print("| requests | aggregate tok/s (runs) | median | vs base |")
    print("|---|---|---|---|")
    for k, v in got.items():
        m = statistics.median(v)
        print(f"| {k} | {', '.join(f'{x:.1f}' for x in v)} | {m:.1f} | {m / base:.2f}x |")


if __name__ == "__main__":
    main()
