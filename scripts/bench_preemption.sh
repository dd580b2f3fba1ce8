#!/usr/bin/env bash
# Starts `lattice serve` with a small KV budget and runs scripts/bench_preemption.py against
# it: 32 concurrent greedy chat requests whose KV memory together exceeds the budget all
# finish, equal to the same requests sent one at a time, with the preemption count and the
# resident memory read from /metrics.
#
#   scripts/bench_preemption.sh [MODEL] [BUDGET]   (default: Qwen2.5-Coder-0.5B GGUF, 48MiB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:-$root/.cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf}
budget=${2:-48MiB}
lattice=${LATTICE:-$root/target/release/lattice}
[ -x "$lattice" ] || (cd "$root" && cargo build --release -p lattice-cli)
py=$("$root/scripts/setup_openai_client.sh")
log=$(mktemp)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -f "$log"' EXIT
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# shellcheck disable=SC2086
"$lattice" serve --model "$model" --served-model-name default --kv-cache-memory "$budget" \
  --max-running 32 --max-queue 64 ${EXTRA_FLAGS:-} --port 0 2>"$log" &
for _ in $(seq 1200); do
  grep -q "listening on" "$log" && break
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
"$py" "$root/scripts/bench_preemption.py" --base-url "$url" ${BENCH_FLAGS:-}
