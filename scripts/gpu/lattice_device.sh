#!/usr/bin/env bash
# One device call for the CUDA backend (issue 13): finds the CUDA libraries, runs the op-parity
# and model-parity test binaries, makes the random Qwen3-0.6B checkpoints, and measures Lattice
# (`lattice bench generate --device cuda`) and the PyTorch peer on the same weights.
#
# Carried in .device/ (built here, stripped): lattice, cuda_ops, cuda_parity,
# qwen3-tokenizer/tokenizer.json.gz (scripts/gpu/prepare_carry.py) and, for the Qwen3.5 shape,
# qwen35-tokenizer/tokenizer.json.gz (gzip of .cache/qwen35/tokenizer.json). Results under $OUT.
#   STEPS="env tests models lattice hybrid torch" bash scripts/gpu/lattice_device.sh
# `hybrid` measures the Qwen3.5-0.8B shape (scripts/gen_random_qwen35.py, bf16) like `lattice`;
# RUNS (5) and STREAMS (8 64) apply to both.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
steps=${STEPS:-env tests models lattice torch}
models=${MODELS_DIR:-/tmp/gpu-models}
export PYTHONUNBUFFERED=1

libdirs=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -maxdepth 8 \
  \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' \) 2>/dev/null |
  grep -v /stubs/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}"
export CARGO_MANIFEST_DIR="$PWD/crates/inference"

for step in $steps; do
  echo "== $step ($(date +%T))"
  case $step in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
      lscpu | grep -m1 'Model name'
      echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
      ;;
    tests)
      .device/cuda_ops --nocapture --test-threads=1 2>&1 | tee "$out/cuda_ops.log" | grep -vE '^$'
      .device/cuda_parity --nocapture --test-threads=1 2>&1 | tee "$out/cuda_parity.log" | grep -vE '^$'
      ;;
    models)
      [ -f "$models/qwen3-0.6b-bf16/model.safetensors" ] ||
        python3 scripts/gpu/make_models.py --out "$models" --device cuda \
          --tokenizer .device/qwen3-tokenizer/tokenizer.json.gz
      [ ! -f .device/qwen35-tokenizer/tokenizer.json.gz ] ||
        [ -f "$models/qwen35-0.8b-bf16/model.safetensors" ] ||
        python3 scripts/gen_random_qwen35.py --out "$models/qwen35-0.8b-bf16" \
          --tokenizer .device/qwen35-tokenizer/tokenizer.json.gz
      ;;
    hybrid)
      for streams in ${STREAMS:-8 64}; do
        .device/lattice bench generate --model "$models/qwen35-0.8b-bf16" --bf16 --device cuda \
          --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-5}" --streams "$streams" --json 2>&1 |
          tee "$out/lattice_qwen35_s$streams.json" | grep -v '^bench: run'
      done
      ;;
    lattice)
      # bf16 and f32 weights; decode steps of up to 8 sequences are replayed CUDA graphs, and
      # LATTICE_CUDA_GRAPHS=0 runs the same bf16 test eagerly (what recording saves).
      for run in ${RUNS_LATTICE:-bf16 bf16-eager f32}; do
        case $run in
          bf16) m=bf16; flags=--bf16; env= ;;
          bf16-eager) m=bf16; flags=--bf16; env=LATTICE_CUDA_GRAPHS=0 ;;
          f32) m=f32; flags=; env= ;;
        esac
        for streams in ${STREAMS:-8 64}; do
          env $env .device/lattice bench generate --model "$models/qwen3-0.6b-$m" $flags --device cuda \
            --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-5}" --streams "$streams" --json 2>&1 |
            tee "$out/lattice_${run}_s$streams.json" | grep -v '^bench: run'
        done
      done
      ;;
    torch)
      python3 scripts/gpu/torch_bench.py --model "$models/qwen3-0.6b-bf16" --device cuda \
        --out "$out/torch_bench.json" ${BENCH_ARGS:---sections prefill,eager} 2>&1 | tail -40
      ;;
  esac
done
echo "== done ($(date +%T))"
