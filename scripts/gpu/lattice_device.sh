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
# RUNS (5) and STREAMS (8 64) apply to both. `gguf` builds llama.cpp with CUDA from the carried
# .device/llama-src.tar.gz (scripts/gpu/pack_llama_src.sh), converts the bf16 Qwen3-0.6B to a
# BF16 GGUF, quantizes it to each of QUANTS (Q4_K_M Q4_0 Q8_0) and runs llama-bench and
# `lattice bench generate` on the same files (QUANT_KERNELS="default gemv q8blocks": A/B of
# the product kernels; LLAMA_CUDA=0 builds llama-quantize alone, without llama-bench).
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
    gguf)
      # LLAMA_CUDA=0: llama-quantize only, a CPU build (a minute instead of four), no llama-bench.
      lc=/tmp/llama.cpp
      cuda=${LLAMA_CUDA:-1}
      bin="$lc/build-cuda$cuda/bin"
      if [ ! -x "$bin/llama-quantize" ]; then
        [ -d "$lc" ] || tar -xzf .device/llama-src.tar.gz -C /tmp
        targets=llama-quantize
        [ "$cuda" = 1 ] && targets="llama-quantize llama-bench"
        cmake -S "$lc" -B "$lc/build-cuda$cuda" -DGGML_CUDA=$([ "$cuda" = 1 ] && echo ON || echo OFF) \
          -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON \
          -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
          -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release > "$out/llama_cmake.log" 2>&1 ||
          { tail -20 "$out/llama_cmake.log"; continue; }
        # shellcheck disable=SC2086
        cmake --build "$lc/build-cuda$cuda" -j "$(nproc)" --target $targets \
          > "$out/llama_build.log" 2>&1 || { tail -20 "$out/llama_build.log"; continue; }
        echo "llama.cpp built ($(date +%T))"
      fi
      base="$models/qwen3-0.6b-bf16.gguf"
      [ -f "$base" ] || PYTHONPATH="$lc/gguf-py" python3 "$lc/convert_hf_to_gguf.py" \
        "$models/qwen3-0.6b-bf16" --outtype bf16 --outfile "$base" > "$out/convert.log" 2>&1 ||
        { tail -20 "$out/convert.log"; continue; }
      for q in ${QUANTS:-Q4_K_M Q4_0 Q8_0}; do
        f="$models/qwen3-0.6b-$q.gguf"
        [ -f "$f" ] || "$bin/llama-quantize" "$base" "$f" "$q" > "$out/quantize_$q.log" 2>&1 ||
          { tail -5 "$out/quantize_$q.log"; continue; }
        ls -la "$f"
        [ "$cuda" != 1 ] || "$bin/llama-bench" -m "$f" -ngl 99 -p 512 -n 128 -r "${RUNS:-5}" -o md 2>&1 |
          tee "$out/llama_bench_$q.md" | grep -E '^\|'
        for streams in ${STREAMS:-8 64}; do
          for kern in ${QUANT_KERNELS:-default}; do
            # A/B switches: gemv (LATTICE_CUDA_QUANT=gemv: the matrix-vector kernel for every
            # product), q8blocks (LATTICE_CUDA_Q8=blocks: Q8_0 decode in the block kernel).
            case $kern in
              gemv) env=LATTICE_CUDA_QUANT=gemv ;;
              q8blocks) env=LATTICE_CUDA_Q8=blocks ;;
              *) env= ;;
            esac
            env $env .device/lattice bench generate --model "$f" --device cuda \
              --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-5}" --streams "$streams" \
              --json 2>&1 | tee "$out/lattice_${q}_${kern}_s$streams.json" | grep -v '^bench: run'
          done
        done
      done
      # The same files on the GPU against the CPU (logits, greedy).
      LATTICE_TEST_GGUF=$(ls "$models"/qwen3-0.6b-Q*.gguf | tr '\n' ,) .device/cuda_parity \
        quantized_gguf --nocapture 2>&1 | tee "$out/gguf_parity.log" | grep -vE '^$'
      ;;
    torch)
      python3 scripts/gpu/torch_bench.py --model "$models/qwen3-0.6b-bf16" --device cuda \
        --out "$out/torch_bench.json" ${BENCH_ARGS:---sections prefill,eager} 2>&1 | tail -40
      ;;
  esac
done
echo "== done ($(date +%T))"
