#!/usr/bin/env bash
# Qwen3.5-0.8B-shaped speed (random weights), llama.cpp vs Lattice on the same GGUF files (arch
# qwen35, written by llama.cpp's converter through scripts/gen_qwen35_gguf.py): Q8_0 and BF16.
# CPU, 2 threads. Prints a markdown table of medians.
#
#   scripts/bench_qwen35_gguf.sh [RUNS]     (default RUNS=3)
#
# Tests, per file (sizes from PP="512 2048", GEN=64, DEPTH=4096 in the environment; a quick
# smoke run: PP="64" GEN=8 DEPTH=128 scripts/bench_qwen35_gguf.sh 1):
#   pp512, pp2048      one pass over N prompt tokens from an empty context
#   tg64               64 one-token decode steps from an empty context
#   tg64 @ d4096       64 decode steps after 4,096 tokens already in the context (prefilled untimed)
# Commands:
#   llama-bench -m FILE -p 512,2048 -n 64 -t 2 -r RUNS -o json
#   llama-bench -m FILE -p 0 -n 64 -d 4096 -t 2 -r RUNS -o json
#   lattice bench generate --model FILE --threads 2 --runs RUNS --json, with
#     --prompt-tokens 512 --gen-tokens 64 | --prompt-tokens 2048 --gen-tokens 1 |
#     --prompt-tokens 1 --gen-tokens 64 --context 4096
# llama.cpp's median pools its runs' tokens/s (samples_ts); Lattice's is the median it prints.
#
# Missing files are made first: the safetensors checkpoint by scripts/gen_random_qwen35.py, the
# GGUF files by scripts/gen_qwen35_gguf.py (both need .cache/venv-ref). Needs
# scripts/build_llama_cpp.sh and `cargo build --release -p lattice-cli`. Environment: LATTICE
# (binary, default target/release/lattice), LLAMA_BENCH (binary), MODELS (space-separated GGUF
# paths, default the Q8_0 and BF16 files in .cache/models/), TITLE (the table's caption; other
# models, e.g. scripts/bench_bitnet.sh, pass theirs in MODELS, made beforehand). Measure on an otherwise idle machine
# (the load average before and after is printed; see scripts/bench_generate.sh on OpenMP).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
runs="${1:-3}"
threads=2
pp_sizes="${PP:-512 2048}"
gen="${GEN:-64}"
depth="${DEPTH:-4096}"
bench="${LLAMA_BENCH:-$root/.cache/llama.cpp/build/bin/llama-bench}"
lattice="${LATTICE:-$root/target/release/lattice}"
py="$root/.cache/venv-ref/bin/python"
src="$root/.cache/models/qwen35-0.8b-random"
models="${MODELS:-$root/.cache/models/qwen35-0.8b-random.q8_0.gguf $root/.cache/models/qwen35-0.8b-random.bf16.gguf}"

for exe in "$bench" "$lattice"; do
  if [ ! -x "$exe" ]; then
    echo "error: $exe missing (scripts/build_llama_cpp.sh; cargo build --release -p lattice-cli)" >&2
    exit 1
  fi
done
for m in $models; do
  [ -f "$m" ] && continue
  [ -f "$src/model.safetensors" ] || "$py" "$root/scripts/gen_random_qwen35.py"
  outtype=$(basename "$m" .gguf)
  outtype=${outtype##*.}
  echo "converting $src to $m ($outtype)" >&2
  "$py" "$root/scripts/gen_qwen35_gguf.py" --model "$src" --outtype "$outtype" --outfile "$m" >/dev/null
done

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

i=0
for m in $models; do
  i=$((i + 1))
  echo "$(basename "$m"): llama-bench" >&2
  "$bench" -m "$m" -p "${pp_sizes// /,}" -n "$gen" -t "$threads" -r "$runs" -o json \
    >"$work/llama-$i-a.json" 2>"$work/err" || { tail -n 5 "$work/err" >&2; exit 1; }
  "$bench" -m "$m" -p 0 -n "$gen" -d "$depth" -t "$threads" -r "$runs" -o json \
    >"$work/llama-$i-b.json" 2>"$work/err" || { tail -n 5 "$work/err" >&2; exit 1; }
  echo "$(basename "$m"): lattice bench generate" >&2
  common=(bench generate --model "$m" --threads "$threads" --runs "$runs" --json)
  n=$gen # the first prompt size's invocation also measures tgGEN
  for p in $pp_sizes; do
    "$lattice" "${common[@]}" --prompt-tokens "$p" --gen-tokens "$n" >"$work/lattice-$i-pp$p.json" \
      2>"$work/err" || { tail -n 5 "$work/err" >&2; exit 1; }
    [ "$n" = "$gen" ] && cp "$work/lattice-$i-pp$p.json" "$work/lattice-$i-tg.json"
    n=1
  done
  "$lattice" "${common[@]}" --prompt-tokens 1 --gen-tokens "$gen" --context "$depth" \
    >"$work/lattice-$i-depth.json" 2>"$work/err" || { tail -n 5 "$work/err" >&2; exit 1; }
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work" "$runs" "load average before: $load_before, after: $load_after" "$pp_sizes" "$gen" "$depth" $models <<'PY'
import json, os, statistics, sys

work, runs, env_note, pp_sizes, gen, depth = sys.argv[1:7]
models = sys.argv[7:]
pps = pp_sizes.split()
tests = [f"pp{p}" for p in pps] + [f"tg{gen}", f"tg{gen} @ d{depth}"]
title = os.environ.get("TITLE", "Qwen3.5-0.8B shape (random weights)")
print(f"{title}, CPU, 2 threads, medians of {runs} runs ({env_note})")
print()
print("| model | test | llama.cpp t/s | Lattice t/s | Lattice / llama.cpp |")
print("|---|---|---|---|---|")
for i, m in enumerate(models, 1):
    llama = {t: [] for t in tests}
    for part in "ab":
        for rec in json.load(open(os.path.join(work, f"llama-{i}-{part}.json"))):
            if rec["n_gen"] == 0:
                test = f"pp{rec['n_prompt']}"
            else:
                test = f"tg{rec['n_gen']}" + (f" @ d{rec['n_depth']}" if rec.get("n_depth") else "")
            llama.setdefault(test, []).extend(rec["samples_ts"])
    read = lambda name: json.load(open(os.path.join(work, f"lattice-{i}-{name}.json")))
    lat = {f"pp{p}": read(f"pp{p}")["prompt_tokens_per_s"] for p in pps}
    lat[f"tg{gen}"] = read("tg")["gen_tokens_per_s"]
    lat[f"tg{gen} @ d{depth}"] = read("depth")["gen_tokens_per_s"]
    for t in tests:
        lm = statistics.median(llama[t]) if llama.get(t) else None
        tm = lat.get(t)
        ratio = f"{tm / lm:.2f}" if lm and tm else "n/a"
        fmt = lambda x: "n/a" if x is None else f"{x:.1f}"
        print(f"| {os.path.basename(m)} | {t} | {fmt(lm)} | {fmt(tm)} | {ratio} |")
PY
