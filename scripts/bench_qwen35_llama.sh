#!/usr/bin/env bash
# Qwen3.5-0.8B shape, Lattice against llama.cpp on this machine, in one command: ROUNDS
# alternating rounds of pp512 / tg32 (2 threads) for
#   llama.cpp on its own BF16 and Q8_0 conversions of the random checkpoint (llama-bench),
#   Lattice --bf16 and default on the safetensors, Lattice on the same Q8_0 GGUF,
#   and, with OLD=path/to/lattice, the same Lattice rows for that binary (an A/B of two builds).
# Prints the CPU model and Lattice's chosen kernels, then one line per run.
#
#   scripts/bench_qwen35_llama.sh [ROUNDS]
# Needs: scripts/gen_random_qwen35.py's checkpoint, scripts/build_llama_cpp.sh (NO_AMX=1 on a
# Xeon with AMX: the native build's AMX path dies there with SIGILL on Q8_0), and the GGUF files
# of scripts/gen_qwen35_gguf.py (made here on first use).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rounds=${1:-3}
model=.cache/models/qwen35-0.8b-random
[ -f "$model/model.safetensors" ] || .cache/venv-ref/bin/python scripts/gen_random_qwen35.py
for t in bf16 q8_0; do
  f=$model.$t.gguf
  [ -f "$f" ] || .cache/venv-ref/bin/python scripts/gen_qwen35_gguf.py --model "$model" \
    --outtype $t --outfile "$f" | tail -1
done
llama=${LLAMA_BENCH:-}
if [ -z "$llama" ]; then
  for d in .cache/llama.cpp/build-noamx/bin .cache/llama.cpp/build/bin; do
    if [ -x "$d/llama-bench" ]; then llama=$d/llama-bench; break; fi
  done
fi
[ -n "$llama" ] || { echo "no llama-bench: run scripts/build_llama_cpp.sh (NO_AMX=1 on AMX Xeons)" >&2; exit 1; }
lattice=${LATTICE:-target/release/lattice}
grep -m1 "model name" /proc/cpuinfo
"$lattice" bench peaks --runs 1 2>/dev/null | head -1
lat() { # label binary args...
  local label=$1 bin=$2; shift 2
  echo "$label: $("$bin" bench generate --threads 2 --runs 1 --prompt-tokens 512 --gen-tokens 32 "$@" 2>&1 | grep '^bench: run' | sed 's/bench: run 1\/1: //')"
}
for r in $(seq "$rounds"); do
  echo "== round $r"
  for t in bf16 q8_0; do
    echo "llama.cpp $t: $("$llama" -m $model.$t.gguf -p 512 -n 32 -t 2 -r 1 -o csv 2>/dev/null \
      | awk -F, 'NR>1 {gsub(/"/,""); printf "%s %s tokens/s, ", ($(NF-7)>0?"pp"$(NF-7):"tg"$(NF-6)), $(NF-1)}')"
  done
  for b in "$lattice" ${OLD:+"$OLD"}; do
    tag=$([ "$b" = "$lattice" ] && echo "" || echo " (OLD)")
    lat "lattice --bf16$tag" "$b" --model $model --bf16
    lat "lattice default$tag" "$b" --model $model
    lat "lattice q8_0 gguf$tag" "$b" --model $model.q8_0.gguf
  done
done
