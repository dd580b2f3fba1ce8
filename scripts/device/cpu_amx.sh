#!/usr/bin/env bash
# AMX on the lent device machine's CPU (an Intel Xeon with AMX-BF16 / AMX-INT8; the build
# machines often have none), run from the repo root there with `.device/` carried:
#   .device/lattice, .device/libtests (lattice-inference's unit tests), .device/quant_tests
#   (tests/quant.rs, optional), .device/kernels (the
#   kernels bench), .device/minilm/ (all-MiniLM-L6-v2's config, tokenizer and pipeline files),
#   .device/stsb-en-dev.csv; for `qwen35`: .device/llama-src.tar.xz (llama.cpp's sources as
#   vendored by llama-cpp-python 0.3.36, GPU backends left out) and .device/qwen35-tokenizer.json.gz.
# Steps (arguments, in order): tests int8 kernels prep embed qwen35 (prep starts qwen35's build and
# model in the background on cores 2-15; ROUNDS sets embed's rounds, default 2). Every engine runs on cores 0-1
# (taskset), as on the 2-core build machines. Writes logs and JSON lines to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/amx-out}
mkdir -p "$OUT"
D=.device
pin() { if command -v taskset >/dev/null; then taskset -c 0,1 "$@"; else "$@"; fi; }
grep -m1 "model name" /proc/cpuinfo | tee "$OUT/cpu.txt"
for step in "$@"; do
  echo "== $step ($(date +%T))"
  case "$step" in
    tests)
      "$D/libtests" bf16 --nocapture 2>&1 | tee "$OUT/tests.txt" | grep -E "pair arith|SKIPPED|AMX|test result|FAILED|panicked"
      "$D/libtests" int8 --nocapture 2>&1 | tee "$OUT/tests-int8.txt" | grep -E "SKIPPED|test result|FAILED|panicked"
      "$D/libtests" subnormal 2>&1 | grep -E "test result|FAILED|panicked"
      # The quantized tiles against the portable table, bit for bit (Q8_0 on AMX-INT8 there).
      if [ -x "$D/quant_tests" ]; then
        "$D/quant_tests" --nocapture 2>&1 | tee "$OUT/tests-quant.txt" | grep -E "SKIPPED|AMX|test result|FAILED|panicked"
      fi ;;
    int8)
      # The int8 tiles alone (`benches/ternary.rs --int8`, carried as .device/ternary_bench).
      for amx in 1 0; do
        echo "LATTICE_AMX=$amx"; LATTICE_AMX=$amx pin "$D/ternary_bench" --int8 --prompt --m 512 --isa avx512
      done 2>&1 | tee "$OUT/int8.txt" ;;
    kernels)
      for amx in 1 0; do
        echo "LATTICE_AMX=$amx"; LATTICE_AMX=$amx pin "$D/kernels" --bf16 --threads 2 --quick
        LATTICE_AMX=$amx pin "$D/kernels" --bf16 --threads 1 --quick
      done 2>&1 | tee "$OUT/kernels.txt" ;;
    embed)
      python3 scripts/device/make_random_encoder.py "$D/minilm" .cache/models/minilm-random
      python3 scripts/export_onnx.py --model minilm-random 2>&1 | grep -v Warning | tail -2
      M=.cache/models/minilm-random; S="$D/stsb-en-dev.csv"
      for r in $(seq "${ROUNDS:-2}"); do
        for mode in "" --bf16 --q8; do
          pin "$D/lattice" bench --model $M --data $S --runs 1 --latency-samples 50 --threads 2 $mode 2>/dev/null
        done
        LATTICE_AMX=0 pin "$D/lattice" bench --model $M --data $S --runs 1 --latency-samples 50 --threads 2 --bf16 2>/dev/null | sed 's/"weights":"bf16"/"weights":"bf16 (LATTICE_AMX=0)"/'
        LATTICE_AMX=0 pin "$D/lattice" bench --model $M --data $S --runs 1 --latency-samples 50 --threads 2 --q8 2>/dev/null | sed 's/"weights":"int8"/"weights":"int8 (LATTICE_AMX=0)"/'
        pin python3 scripts/bench_ort.py --model minilm-random --data $S --threads 2 --runs 1 --latency-n 50 2>/dev/null | tail -n 1
        pin python3 scripts/bench_ort.py --model minilm-random --data $S --threads 2 --runs 1 --latency-n 50 --int8 2>/dev/null | tail -n 1
      done | tee "$OUT/embed.jsonl" | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r.get('engine'), r.get('weights'), round(r.get('sentences_per_s', r.get('sentences_per_s_median', 0)),1), 'sent/s')" ;;
    prep)
      # llama.cpp's build and the random Qwen3.5 checkpoint, on cores 2-15 while the other
      # steps measure on cores 0-1; `qwen35` waits for them.
      mkdir -p .cache/qwen35 .cache/llama.cpp/src
      gunzip -c "$D/qwen35-tokenizer.json.gz" > .cache/qwen35/tokenizer.json
      tar -xJf "$D/llama-src.tar.xz" -C .cache/llama.cpp/src
      (cd .cache/llama.cpp/src && taskset -c 2-15 cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
        -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF >/dev/null \
        && taskset -c 2-15 cmake --build build --target llama-bench -j 14 2>&1 | tail -1) \
        > "$OUT/llama-build.txt" 2>&1 &
      taskset -c 2-15 python3 scripts/gen_random_qwen35.py > "$OUT/gen.txt" 2>&1 &
      ;;
    qwen35)
      wait
      cat "$OUT/llama-build.txt" "$OUT/gen.txt"
      for t in bf16 q8_0; do
        python3 scripts/gen_qwen35_gguf.py --model .cache/models/qwen35-0.8b-random --outtype $t \
          --outfile .cache/models/qwen35.$t.gguf 2>&1 | tail -1
      done
      # QROUNDS rounds (default 2) of: llama.cpp BF16 GGUF; Lattice --bf16 (AMX-BF16) and the
      # exact default on the safetensors; llama.cpp Q8_0 GGUF; Lattice on the same Q8_0 file
      # with and without AMX-INT8; in the first round also --bf16 without AMX and three runs
      # with LATTICE_SUBNORMALS=keep.
      M=.cache/models/qwen35-0.8b-random; Q=.cache/models/qwen35.q8_0.gguf
      G="--prompt-tokens 512 --gen-tokens ${GEN:-64} --runs 1 --threads 2 --json"
      LB=.cache/llama.cpp/src/build/bin/llama-bench
      for r in $(seq "${QROUNDS:-2}"); do
        pin $LB -m .cache/models/qwen35.bf16.gguf -p 512 -n "${GEN:-64}" -t 2 -r 1 -o jsonl 2>/dev/null
        pin "$D/lattice" bench generate --model $M --bf16 $G 2>/dev/null
        pin "$D/lattice" bench generate --model $M $G 2>/dev/null
        pin $LB -m $Q -p 512 -n "${GEN:-64}" -t 2 -r 1 -o jsonl 2>/dev/null
        pin "$D/lattice" bench generate --model $Q $G 2>/dev/null
        LATTICE_AMX=0 pin "$D/lattice" bench generate --model $Q $G 2>/dev/null | sed 's/^{/{"amx":0,/'
        if [ "$r" = 1 ]; then
          LATTICE_AMX=0 pin "$D/lattice" bench generate --model $M --bf16 $G 2>/dev/null | sed 's/^{/{"amx":0,/'
          # Strict IEEE subnormals (the pools flush them by default).
          for m in "$M --bf16" "$M" "$Q"; do
            LATTICE_SUBNORMALS=keep pin "$D/lattice" bench generate --model $m $G 2>/dev/null \
              | sed 's/^{/{"subnormals":"keep",/'
          done
        fi
      done | tee "$OUT/qwen35.jsonl" ;;
  esac
done
echo "== done ($(date +%T))"
