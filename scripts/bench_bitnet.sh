#!/usr/bin/env bash
# BitNet b1.58 2B4T-shaped speed (random weights), llama.cpp vs Lattice on the same GGUF files
# (arch `bitnet`: TQ2_0 and TQ1_0 projections, Q4_K embeddings / output head, Llama 3 vocabulary;
# written by scripts/gen_random_bitnet_gguf.py). CPU, 2 threads; a markdown table of medians.
#
#   scripts/bench_bitnet.sh [RUNS]     (default RUNS=3; PP, GEN, DEPTH as scripts/bench_qwen35_gguf.sh)
#
# The measuring and the table are scripts/bench_qwen35_gguf.sh's (llama-bench -t 2 beside
# lattice bench generate --threads 2 on each file). Needs .cache/venv-ref,
# scripts/build_llama_cpp.sh and `cargo build --release -p lattice-cli`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
models=""
for t in ${TYPES:-tq2_0 tq1_0}; do
  m="$root/.cache/models/bitnet-2b4t-random.$t.gguf"
  [ -f "$m" ] || "$root/.cache/venv-ref/bin/python" "$root/scripts/gen_random_bitnet_gguf.py" --type "$t" --out "$m" >&2
  models="$models $m"
done
grep -m1 "model name" /proc/cpuinfo | sed 's/.*: /CPU: /'
MODELS="${models# }" TITLE="BitNet b1.58 2B4T shape (random weights)" \
  DEPTH="${DEPTH:-1024}" exec "$root/scripts/bench_qwen35_gguf.sh" "${1:-3}"
