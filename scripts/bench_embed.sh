#!/usr/bin/env bash
# Embedding throughput and latency, Lattice against ONNX Runtime, in one command on one machine.
#
#   scripts/bench_embed.sh [ROUNDS] [MODEL...]     (defaults: 3 rounds, both real models)
#   MODE=q8 scripts/bench_embed.sh ...    lattice --q8 against ORT's dynamic int8 quantization
#   MODE=bf16 scripts/bench_embed.sh ...  lattice --bf16 against ORT f32
#
# Workload (both engines): the 2,910 unique sentences of STS-B dev in file order, batches of 32,
# 2 threads; tokenization excluded (timed separately); batch-1 latency over the first 100
# sentences. Each round runs one timed pass of each engine back to back (after a warm-up pass),
# so machine noise hits both alike; the table shows the median over rounds and the ratio.
# Needs .cache/venv-ref (scripts/setup_reference_env.sh) and the ONNX exports
# (.cache/venv-ref/bin/python scripts/export_onnx.py), made on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
shift || true
models=("$@")
mode=${MODE:-f32}
case "$mode" in
  f32) lat_flag=(); ort_flag=() ;;
  bf16) lat_flag=(--bf16); ort_flag=() ;;
  q8) lat_flag=(--q8); ort_flag=(--int8) ;;
  *) echo "MODE must be f32, bf16 or q8" >&2; exit 2 ;;
esac
[ ${#models[@]} -gt 0 ] || models=(all-MiniLM-L6-v2 all-mpnet-base-v2)
data=${STSB:-../shared/data/stsb/stsb-en-dev.csv}
py=.cache/venv-ref/bin/python
[ -x "$py" ] || ./scripts/setup_reference_env.sh
./scripts/fetch_models.sh
cargo build --release -q -p lattice-cli
out=.cache/bench
mkdir -p "$out"
for m in "${models[@]}"; do
  [ -f ".cache/onnx/$m.onnx" ] || "$py" scripts/export_onnx.py --model "$m"
  : > "$out/$m.lattice.jsonl"
  : > "$out/$m.ort.jsonl"
  echo "bench: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), mode $mode" >&2
  for r in $(seq "$rounds"); do
    echo "bench: $m round $r/$rounds: lattice" >&2
    ./target/release/lattice bench --model ".cache/models/$m" --data "$data" --batch 32 \
      --runs 1 --latency-samples 100 --threads 2 "${lat_flag[@]}" 2>/dev/null >> "$out/$m.lattice.jsonl"
    echo "bench: $m round $r/$rounds: onnxruntime" >&2
    "$py" scripts/bench_ort.py --model "$m" --data "$data" --threads 2 --batch 32 --runs 1 \
      --latency-n 100 "${ort_flag[@]}" 2>/dev/null | tail -n 1 >> "$out/$m.ort.jsonl"
  done
done
"$py" - "$out" "${models[@]}" <<'PY'
import json, statistics, sys
out, models = sys.argv[1], sys.argv[2:]
print("| model | engine | sentences/s (median) | ratio | batch-1 latency ms (median) | ratio (ORT/Lattice) | kernel GFLOP/s |")
print("|---|---|---|---|---|---|---|")
for m in models:
    lat = [json.loads(l) for l in open(f"{out}/{m}.lattice.jsonl")]
    ort = [json.loads(l) for l in open(f"{out}/{m}.ort.jsonl")]
    ls = statistics.median(x["sentences_per_s"] for x in lat)
    os_ = statistics.median(x["sentences_per_s_median"] for x in ort)
    ll = statistics.median(x["latency_ms_median"] for x in lat)
    ol = statistics.median(x["latency_ms_median"] for x in ort)
    gf = statistics.median(x["gflops"] for x in lat)
    print(f"| {m} | Lattice {lat[0]['weights']} ({lat[0]['isa']}) | {ls:.1f} | **{ls/os_:.2f}x** | {ll:.2f} | **{ol/ll:.2f}x** | {gf:.0f} |")
    print(f"| {m} | ONNX Runtime {ort[0]['ort_version']} {ort[0]['weights']} | {os_:.1f} | 1.00x | {ol:.2f} | 1.00x | |")
PY
