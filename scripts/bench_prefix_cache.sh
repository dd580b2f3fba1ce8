#!/usr/bin/env bash
# Multi-turn chat time to first token with and without the prefix cache
# (scripts/bench_prefix_cache.py through the official OpenAI client against `lattice serve`).
# For each model: one server with the cache on, one with --no-prefix-cache, the same 4-turn
# conversation (~2,000-token system prompt, greedy); prints each turn and checks that both
# servers produced the same texts.
#
#   scripts/bench_prefix_cache.sh MODEL [MODEL...]     (default: Qwen2.5-Coder-0.5B GGUF)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
lattice=${LATTICE:-$root/target/release/lattice}
[ -x "$lattice" ] || (cd "$root" && cargo build --release -p lattice-cli)
py=$("$root/scripts/setup_openai_client.sh")
models=("$@")
[ ${#models[@]} -gt 0 ] || models=("$root/.cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf")
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
for model in "${models[@]}"; do
  for mode in cache nocache; do
    flags=()
    [ "$mode" = nocache ] && flags=(--no-prefix-cache)
    "$lattice" serve --model "$model" --served-model-name default --port 0 ${EXTRA_FLAGS:-} "${flags[@]}" 2>"$tmp/serve.log" &
    pid=$!
    for _ in $(seq 600); do
      grep -q "listening on" "$tmp/serve.log" 2>/dev/null && break
      kill -0 $pid 2>/dev/null || { cat "$tmp/serve.log" >&2; exit 1; }
      sleep 0.5
    done
    url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.log" | head -1)
    echo "== $(basename "$model") prefix cache: $mode" >&2
    "$py" "$root/scripts/bench_prefix_cache.py" --base-url "$url/v1" ${BENCH_FLAGS:-} | tee "$tmp/$mode.jsonl"
    curl -s "$url/metrics" | grep -E '^lattice_(prefix|kv|preempt)' >&2 || true
    kill -TERM $pid; wait $pid || true
  done
  if diff <(grep '"turn"' "$tmp/cache.jsonl" | "$py" -c 'import sys,json; [print(json.loads(l)["text"]) for l in sys.stdin]') \
          <(grep '"turn"' "$tmp/nocache.jsonl" | "$py" -c 'import sys,json; [print(json.loads(l)["text"]) for l in sys.stdin]') >/dev/null; then
    echo "texts equal with and without the prefix cache" >&2
  else
    echo "TEXTS DIFFER with and without the prefix cache" >&2
    exit 1
  fi
done
