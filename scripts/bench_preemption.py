#!/usr/bin/env python3
"""Preemption under a KV memory budget, end to end: sends N different greedy chat requests at
once (threads, the official OpenAI client) to a `lattice serve` started with a small
--kv-cache-memory, then the same requests one at a time, and checks that every answer is the
same; reads lattice_preemptions_total, the KV gauges and process_resident_memory_bytes from
/metrics while the concurrent requests run. scripts/bench_preemption.sh starts the server.

  python bench_preemption.py --base-url http://127.0.0.1:PORT [--requests 32] [--max-tokens 160]
"""

import argparse
import json
import threading
import time
import urllib.request

from openai import OpenAI


def metrics(base):
    text = urllib.request.urlopen(base + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and " " in line:
            k, v = line.rsplit(" ", 1)
            if k.startswith(("lattice_kv", "lattice_preempt", "process_resident", "lattice_prefix")):
                out[k] = float(v)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--stop-at-eos", action="store_true",
                    help="end answers at end-of-sequence (default: ignore_eos, so every sequence grows to max_tokens)")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url + "/v1", api_key="unused", max_retries=0, timeout=1800)
    prompts = [
        f"Request {i}: write {3 + i % 4} short sentences about the number {17 * i + 3} "
        f"and the colour {['red', 'green', 'blue', 'amber', 'violet'][i % 5]}."
        for i in range(args.requests)
    ]

    def ask(p):
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": p}],
            max_tokens=args.max_tokens, temperature=0,
            extra_body={} if args.stop_at_eos else {"ignore_eos": True},
        )
        return r.choices[0].message.content, r.usage.completion_tokens

    before = metrics(args.base_url)
    results = [None] * len(prompts)
    peak = {"rss": 0.0, "kv": 0.0}
    done = threading.Event()

    def watch():
        while not done.is_set():
            m = metrics(args.base_url)
            peak["rss"] = max(peak["rss"], m.get("process_resident_memory_bytes", 0))
            peak["kv"] = max(peak["kv"], m.get("lattice_kv_used_bytes", 0))
            time.sleep(0.2)

    def work(i):
        results[i] = ask(prompts[i])

    watcher = threading.Thread(target=watch)
    watcher.start()
    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    concurrent_s = time.perf_counter() - t0
    done.set()
    watcher.join()
    after = metrics(args.base_url)
    t0 = time.perf_counter()
    alone = [ask(p) for p in prompts]
    alone_s = time.perf_counter() - t0
    same = sum(1 for a, b in zip(results, alone) if a[0] == b[0])
    print(json.dumps({
        "requests": len(prompts),
        "finished": sum(1 for r in results if r is not None),
        "equal_to_alone": same,
        "generated_tokens": sum(r[1] for r in results),
        "concurrent_s": round(concurrent_s, 2),
        "one_at_a_time_s": round(alone_s, 2),
        "preemptions": after.get("lattice_preemptions_total", 0) - before.get("lattice_preemptions_total", 0),
        "kv_budget_bytes": after.get("lattice_kv_budget_bytes"),
        "kv_peak_used_bytes_sampled": peak["kv"],
        "rss_before_bytes": before.get("process_resident_memory_bytes"),
        "rss_peak_bytes_sampled": peak["rss"],
    }))
    if same != len(prompts):
        for i, (a, b) in enumerate(zip(results, alone)):
            if a[0] != b[0]:
                print(f"request {i} differs:\n  concurrent: {a[0]!r}\n  alone:      {b[0]!r}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
