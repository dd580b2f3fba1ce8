#!/usr/bin/env bash
# Server load benchmark: starts `lattice serve` on a loopback port and drives it from a second
# process with `lattice bench serve`.
#   1. mixed load: CLIENTS concurrent clients (half streamed chat with max_tokens 32, half
#      embeddings of 1-8 sentences) for DURATION seconds: failures, p50/p99 latency, time to
#      first token, throughput, the server's resident memory over the run;
#   2. streams scaling: 1 and 8 concurrent streamed completions of 128 tokens each (median of 3),
#      aggregate tokens/s and the ratio to one stream, for each GGUF model.
#
#   scripts/bench_serve.sh [DURATION] [CLIENTS]      (defaults: 60, 64)
#
# Needs scripts/fetch_models.sh; builds target/release/lattice when missing (LATTICE overrides).
# Measure on an otherwise idle machine: the load average is printed before and after.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
duration="${1:-60}"
clients="${2:-64}"
lattice=${LATTICE:-$root/target/release/lattice}
[ -x "$lattice" ] || (cd "$root" && cargo build --release -p lattice-cli)
models="$root/.cache/models"
embed="$models/all-MiniLM-L6-v2"
gens=("$models/Qwen2.5-Coder-0.5B-Instruct.gguf" "$models/SmolLM2-135M-Instruct.Q4_1.gguf")
log=$(mktemp)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -f "$log"; }
trap cleanup EXIT

start() { # args: lattice serve flags; sets $pid and $url
  "$lattice" serve --port 0 "$@" 2>"$log" &
  pid=$!
  for _ in $(seq 1 600); do
    if port=$(sed -n 's|^lattice serve: listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$log") \
       && [ -n "$port" ]; then
      url="http://127.0.0.1:$port"
      return
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  echo "lattice serve did not start" >&2; cat "$log" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
start --model "${gens[0]}" --embedding-model "$embed"
"$lattice" bench serve --url "$url" --clients "$clients" --duration "$duration" --max-tokens 32
stop
for g in "${gens[@]}"; do
  start --model "$g"
  "$lattice" bench serve --url "$url" --streams 1,8 --gen-tokens 128 --runs 3
  stop
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
