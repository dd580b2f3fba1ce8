#!/usr/bin/env python3
"""Soak and memory-under-load runs of `lattice serve` (issue 19), standard library only.

Starts `target/release/lattice serve` with the given arguments, drives it from CLIENTS threads
for SECONDS with a mix of routes (chat and completions, streamed and not, some streams dropped
half-way, embeddings, rerank, tokenize, malformed and oversized bodies), samples the server's
RSS every second, and prints: requests per kind, failures (answers that are neither the
expected status nor a 429), RSS at start / peak / end (after the load, once idle), and the
RSS trend (least-squares slope over the second half of the run, in MiB per 10 minutes).

  scripts/soak.py --seconds 1800 --clients 8 -- --model DIR --embedding-model DIR --rerank-model DIR
  scripts/soak.py --seconds 120 --clients 64 --prompt-words 1500 -- --model GGUF --kv-cache-memory 256MiB

Exits 1 on any failure or if the server dies.
"""
import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time

from bench_lora import cpu_model  # scripts/ is on the path when this file runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "lattice")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def request(port, path, body, timeout=600, drop_after=None):
    """Sends one request; returns (status, bytes read). drop_after: close after that many bytes."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            if drop_after is not None and len(got) >= drop_after:
                break
        status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else 0
        return status, len(got)
    except (ConnectionResetError, BrokenPipeError):
        return -1, 0
    finally:
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=40, help="words per generation prompt")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("serve_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.serve_args if x != "--"]
    has_embed = "--embedding-model" in args
    has_rerank = "--rerank-model" in args
    p = subprocess.Popen([BIN, "serve", "--port", "0"] + args, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        sys.stderr.write("  | " + line)
        if "listening on http://" in line:
            port = int(line.rsplit(":", 1)[1])
            break
    if port is None:
        sys.exit("the server did not start")
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing".split()

    def prompt(rng):
        return " ".join(rng.choice(words) for _ in range(a.prompt_words))

    kinds = ["chat", "completion", "stream", "dropped_stream", "bad_json", "oversized"]
    if has_embed:
        kinds += ["embeddings", "tokenize"]
    if has_rerank:
        kinds += ["rerank"]
    counts = {k: 0 for k in kinds}
    failures = []
    lock = threading.Lock()
    stop = time.time() + a.seconds

    def client(i):
        rng = random.Random(i)
        while time.time() < stop:
            k = rng.choice(kinds)
            mt = a.max_tokens
            if k == "chat":
                want, r = 200, request(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt(rng)}], "max_tokens": mt})
            elif k == "completion":
                want, r = 200, request(port, "/v1/completions", {"prompt": prompt(rng), "max_tokens": mt, "temperature": 0.7, "seed": i})
            elif k == "stream":
                want, r = 200, request(port, "/v1/completions", {"prompt": prompt(rng), "max_tokens": mt, "stream": True})
            elif k == "dropped_stream":
                want, r = 200, request(port, "/v1/completions", {"prompt": prompt(rng), "max_tokens": 4 * mt, "stream": True}, drop_after=200)
            elif k == "bad_json":
                want, r = 400, request(port, "/v1/chat/completions", b'{"messages": [')
            elif k == "oversized":
                want, r = 413, request(port, "/v1/completions", b'{"prompt": "' + b"a" * (5 << 20) + b'"}')
            elif k == "embeddings":
                want, r = 200, request(port, "/v1/embeddings", {"input": [prompt(rng) for _ in range(4)]})
            elif k == "tokenize":
                want, r = 200, request(port, "/tokenize", {"inputs": prompt(rng)})
            else:
                want, r = 200, request(port, "/rerank", {"query": prompt(rng), "texts": [prompt(rng) for _ in range(4)]})
            status = r[0]
            ok = status == want or status == 429 or (k == "oversized" and status == -1)
            with lock:
                counts[k] += 1
                if not ok:
                    failures.append((k, status))

    samples = []
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.time()
    start_rss = rss_kib(p.pid)
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if p.poll() is not None:
            sys.exit(f"the server died (exit {p.returncode})")
        samples.append((time.time() - t0, rss_kib(p.pid)))
        time.sleep(1.0)
    for t in threads:
        t.join()
    time.sleep(3.0)
    end_rss = rss_kib(p.pid)
    alive = p.poll() is None
    p.terminate()
    p.wait(timeout=60)
    half = [s for s in samples if s[0] >= a.seconds / 2]
    slope = 0.0
    if len(half) > 2:
        n = len(half)
        mx = sum(s[0] for s in half) / n
        my = sum(s[1] for s in half) / n
        den = sum((s[0] - mx) ** 2 for s in half)
        slope = sum((s[0] - mx) * (s[1] - my) for s in half) / den if den else 0.0
    peak = max((s[1] for s in samples), default=start_rss)
    total = sum(counts.values())
    print(f"CPU: {cpu_model()}")
    print(f"serve {' '.join(args)}")
    print(f"{a.clients} clients, {a.seconds:.0f} s, {total} requests: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    print(f"failures: {len(failures)} {failures[:10]}")
    print(f"RSS MiB: start {start_rss / 1024:.1f}, peak {peak / 1024:.1f}, end {end_rss / 1024:.1f}; "
          f"trend over the second half {slope * 600 / 1024:+.2f} MiB per 10 min")
    if failures or not alive:
        sys.exit(1)


if __name__ == "__main__":
    main()
