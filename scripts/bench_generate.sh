#!/usr/bin/env bash
# Text-generation speed: llama.cpp (llama-bench) vs Lattice (`lattice bench generate`) on the two
# real GGUF decoders, CPU, 2 threads. Prints a markdown table of medians.
#
#   scripts/bench_generate.sh [RUNS] [ROUNDS]     (defaults: RUNS=5, ROUNDS=1)
#
# Each round runs, per model, both engines back to back (llama.cpp first in odd rounds, Lattice
# first in even rounds, so that drift in a shared machine's load hits both alike):
#   llama-bench -m FILE -p 512 -n 128 -t 2 -r RUNS -o json
#   target/release/lattice bench generate --model FILE --prompt-tokens 512 --gen-tokens 128 \
#       --threads 2 --runs RUNS --json
# llama.cpp's median pools every run's tokens/s (samples_ts) of all rounds; Lattice's pools the
# per-invocation medians it prints (fields prompt_tokens_per_s, gen_tokens_per_s).
# Also prints llama.cpp's tg128 weight bandwidth: model_size (bytes of all tensors, as reported by
# llama-bench) x tokens/s.
#
# Needs scripts/build_llama_cpp.sh and scripts/fetch_models.sh first; `cargo build --release -p
# lattice-cli` for the Lattice column (without it, or without the subcommand, only llama.cpp is
# reported). Environment: LATTICE (binary, default target/release/lattice), LLAMA_BENCH (binary),
# LLAMA_BENCH_ARGS (extra llama-bench arguments), MODELS (space-separated GGUF paths),
# SKIP_LATTICE=1 to measure llama.cpp alone.
#
# Measure on an otherwise idle machine: the table header shows the load average before and after.
# llama.cpp is built with OpenMP, whose threads spin at barriers; when other processes compete for
# the 2 cores, its tg128 collapses (measured 3 t/s instead of ~26 t/s for SmolLM2 at load 8).
# OMP_WAIT_POLICY=passive (inherited from the environment) makes them sleep instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs="${1:-5}"
rounds="${2:-1}"
bench="${LLAMA_BENCH:-$root/.cache/llama.cpp/build/bin/llama-bench}"
lattice="${LATTICE:-$root/target/release/lattice}"
models="${MODELS:-$root/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf $root/.cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf}"
threads=2

if [ ! -x "$bench" ]; then
  echo "error: $bench missing; run scripts/build_llama_cpp.sh" >&2
  exit 1
fi
use_lattice=1
lattice_note=""
if [ "${SKIP_LATTICE:-0}" = 1 ]; then
  use_lattice=0
  lattice_note="Lattice skipped (SKIP_LATTICE=1)."
elif [ ! -x "$lattice" ]; then
  use_lattice=0
  lattice_note="Lattice not measured: $lattice missing (cargo build --release -p lattice-cli)."
elif ! "$lattice" bench generate --help >/dev/null 2>&1; then
  use_lattice=0
  lattice_note="Lattice not measured: '$lattice bench generate' is not available in this binary."
fi
[ -n "$lattice_note" ] && echo "note: $lattice_note" >&2

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run_llama() { # model idx round
  # shellcheck disable=SC2086
  "$bench" -m "$1" -p 512 -n 128 -t "$threads" -r "$runs" ${LLAMA_BENCH_ARGS:-} -o json 2>"$work/llama-$2-$3.err" \
    >"$work/llama-$2-$3.json" || { cat "$work/llama-$2-$3.err" >&2; return 1; }
}
run_lattice() { # model idx round
  "$lattice" bench generate --model "$1" --prompt-tokens 512 --gen-tokens 128 \
    --threads "$threads" --runs "$runs" --json 2>"$work/lattice-$2-$3.err" \
    >"$work/lattice-$2-$3.json" || {
    echo "warning: lattice bench failed for $1:" >&2
    tail -n 5 "$work/lattice-$2-$3.err" >&2
    rm -f "$work/lattice-$2-$3.json"
  }
}

for ((r = 1; r <= rounds; r++)); do
  i=0
  for m in $models; do
    i=$((i + 1))
    echo "round $r/$rounds: $(basename "$m")" >&2
    if ((r % 2 == 1)); then
      run_llama "$m" "$i" "$r"
      if ((use_lattice)); then run_lattice "$m" "$i" "$r"; fi
    else
      if ((use_lattice)); then run_lattice "$m" "$i" "$r"; fi
      run_llama "$m" "$i" "$r"
    fi
  done
done

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
env_note="load average before: $load_before, after: $load_after; OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}; extra llama-bench args: ${LLAMA_BENCH_ARGS:-none}"

python3 - "$work" "$runs" "$rounds" "$lattice_note" "$env_note" $models <<'PY'
import glob, json, os, statistics, sys

work, runs, rounds, note, env_note = sys.argv[1:6]
models = sys.argv[6:]

def med(xs):
    return statistics.median(xs) if xs else None

def fmt(x):
    return "n/a" if x is None else f"{x:.1f}"

rows, bw = [], []
build = ""
for i, m in enumerate(models, 1):
    llama = {"pp512": [], "tg128": []}
    size = None
    for f in sorted(glob.glob(os.path.join(work, f"llama-{i}-*.json"))):
        for rec in json.load(open(f)):
            test = "pp512" if rec["n_gen"] == 0 else "tg128"
            llama[test] += rec["samples_ts"]
            size = rec["model_size"]
            build = f"llama.cpp as vendored in llama-cpp-python 0.3.36 (build_commit {rec.get('build_commit', '?')}), " \
                    f"{rec.get('cpu_info', '?')}, backend {rec.get('backends', '?')}"
    lat = {"pp512": [], "tg128": []}
    for f in sorted(glob.glob(os.path.join(work, f"lattice-{i}-*.json"))):
        try:
            rec = json.load(open(f))
        except ValueError:
            continue
        lat["pp512"].append(rec["prompt_tokens_per_s"])
        lat["tg128"].append(rec["gen_tokens_per_s"])
    for test in ("pp512", "tg128"):
        lm, tm = med(llama[test]), med(lat[test])
        ratio = f"{tm / lm:.2f}" if lm and tm else "n/a"
        rows.append(f"| {os.path.basename(m)} | {test} | {fmt(lm)} | {fmt(tm)} | {ratio} |")
    tg = med(llama["tg128"])
    if size and tg:
        bw.append(f"| {os.path.basename(m)} | {size / 1e6:.1f} | {tg:.1f} | {size * tg / 1e9:.2f} |")

print(f"Text generation, CPU, 2 threads, -r {runs} x {rounds} round(s). {build}")
print(f"({env_note})")
print()
print("| model | test | llama.cpp t/s (median) | Lattice t/s (median) | Lattice / llama.cpp |")
print("|---|---|---|---|---|")
print("\n".join(rows))
print()
print("| model | weight bytes (MB) | llama.cpp tg128 t/s | llama.cpp tg128 GB/s of weights |")
print("|---|---|---|---|")
print("\n".join(bw))
if note:
    print()
    print(note)
PY
