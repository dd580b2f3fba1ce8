#!/usr/bin/env bash
# Qwen3.5-0.8B-shaped speed (random weights: scripts/gen_random_qwen35.py) with `lattice bench
# generate`: prefill at 512 and 2,048 tokens, decode (64 tokens) from an empty context and after
# 4,096 tokens, for the bf16 checkpoint computed in f32 and for the same weights quantized to
# Q8_0 at load. Prints one JSON object per measurement (medians of RUNS runs).
#
#   scripts/bench_qwen35.sh [RUNS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs=${1:-3}
model="$root/.cache/models/qwen35-0.8b-random"
if [ ! -f "$model/model.safetensors" ]; then
  "$root/.cache/venv-ref/bin/python" "$root/scripts/gen_random_qwen35.py" \
    || python3 "$root/scripts/gen_random_qwen35.py"
fi
lattice=${LATTICE:-$root/target/release/lattice}
[ -x "$lattice" ] || (cd "$root" && cargo build --release -p lattice-cli)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for mode in "" "--q8"; do
  "$lattice" bench generate --model "$model" $mode --threads 2 --runs "$runs" --json \
    --prompt-tokens 512 --gen-tokens 64
  "$lattice" bench generate --model "$model" $mode --threads 2 --runs "$runs" --json \
    --prompt-tokens 2048 --gen-tokens 64 --context 4096
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
