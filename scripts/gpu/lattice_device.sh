#!/usr/bin/env bash
# One device call for the CUDA backend (issue 13): finds the CUDA libraries, runs the op-parity
# and model-parity test binaries, makes the random Qwen3-0.6B checkpoints, and measures Lattice
# (`lattice bench generate --device cuda`) and the PyTorch peer on the same weights.
#
# Carried in .device/ (built here, stripped): lattice, cuda_ops, cuda_parity,
# qwen3-tokenizer/tokenizer.json.gz (scripts/gpu/prepare_carry.py) and, for the Qwen3.5 shape,
# qwen35-tokenizer/tokenizer.json.gz (gzip of .cache/qwen35/tokenizer.json). Results under $OUT.
#   STEPS="env tests models lattice hybrid torch" bash scripts/gpu/lattice_device.sh
# `sampling` measures sampled decoding (picks on the device) beside greedy; `lora` LoRA
# adapters beside the weights (one for every request, and 8 picked per request over HTTP).
# `hybrid` measures the Qwen3.5-0.8B shape (scripts/gen_random_qwen35.py, bf16) like `lattice`;
# RUNS (5) and STREAMS (8 64) apply to both. `fullsize` checks the full-size random checkpoints
# against transformers on the GPU (tests/cuda_parity.rs, LATTICE_TEST_TORCH_REF); `fullbert` a
# full-size random BERT against sentence-transformers (carry .device/minilm, see the step). `gguf` builds llama.cpp with CUDA from the carried
# .device/llama-src.tar.gz (scripts/gpu/pack_llama_src.sh), converts the bf16 Qwen3-0.6B to a
# BF16 GGUF, quantizes it to each of QUANTS (Q4_K_M Q4_0 Q8_0) and runs llama-bench and
# `lattice bench generate` on the same files (QUANT_KERNELS="default gemv q8blocks old": A/B of
# the product kernels; LLAMA_CUDA=0 builds llama-quantize alone, without llama-bench;
# LLAMA_PACK=1 packs the build for later calls, which unpack .device/llama-bin-*). `ncu64`
# times every kernel of a short `bench generate --streams 64` run of the bf16 Qwen3-0.6B shape
# one by one (`ncu --clock-control none`, summed per kernel and grid by ncu_summary.py into
# $OUT/ncu64.txt; NCU_FLAGS replaces --bf16, NCU_TAG suffixes the files): where a 64-row decode
# step's time goes; `ncu1` the same for batch-1 decode of
# NCU_MODEL, and of llama-bench on it when it is a GGUF (after the gguf step).
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/gpu/device_env.sh
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
steps=${STEPS:-env tests models lattice torch}
models=${MODELS_DIR:-/tmp/gpu-models}
export PYTHONUNBUFFERED=1
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
    sampling)
      # Sampled decoding with the picks made on the device: greedy, temperature 0.8 over the
      # whole vocabulary, with top-p 0.95, and with top-k 40, at 1 and 64 streams (bf16).
      # A carried .device/lattice-old (an earlier build, whose sampled steps sent the logits
      # to the host and sampled there) runs the greedy and temperature modes beside it.
      for bin in lattice lattice-old; do
        [ -x ".device/$bin" ] || continue
        for mode in greedy temp topp topk; do
          case $mode in
            greedy) s= ;;
            temp) s="--stream-temperature 0.8" ;;
            topp) s="--stream-temperature 0.8 --stream-top-p 0.95" ;;
            topk) s="--stream-temperature 0.8 --stream-top-k 40" ;;
          esac
          [ "$bin" = lattice ] || [ "$mode" = greedy ] || [ "$mode" = temp ] || continue
          for streams in ${STREAMS:-1 64}; do
            ".device/$bin" bench generate --model "$models/qwen3-0.6b-bf16" --bf16 --device cuda \
              --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-3}" --streams "$streams" $s \
              --json 2>&1 | tee "$out/sampling_${bin}_${mode}_s$streams.json" | grep -v '^bench: run'
          done
        done
      done
      ;;
    lora)
      # LoRA beside the weights on the GPU: 8 random rank-16 adapters on every attention and
      # MLP projection (scripts/gen_lora_bench_adapters.py, Qwen3-0.6B shape); `bench
      # generate` (bf16 weights) without an adapter, with one unmerged (decode steps replayed)
      # and merged at load; then the server with the 8 adapters picked per request
      # (scripts/bench_lora.py).
      [ -f /tmp/lora-bench/adapter-7/adapter_config.json ] ||
        python3 scripts/gen_lora_bench_adapters.py --shape qwen3-0.6b --out /tmp/lora-bench > /dev/null
      for streams in ${STREAMS:-1 64}; do
        for mode in none unmerged merged none unmerged merged; do
          case $mode in
            none) flags= ;;
            unmerged) flags="--lora /tmp/lora-bench/adapter-0" ;;
            merged) flags="--lora /tmp/lora-bench/adapter-0 --lora-merge" ;;
          esac
          # shellcheck disable=SC2086
          .device/lattice bench generate --model "$models/qwen3-0.6b-bf16" --bf16 --device cuda \
            --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-3}" --streams "$streams" $flags \
            --json 2>&1 | tee -a "$out/lora_${mode}_s$streams.json" | grep -v '^bench: run'
        done
      done
      python3 scripts/bench_lora.py "$models/qwen3-0.6b-bf16" /tmp/lora-bench --bin .device/lattice \
        --serve-args "--device cuda --bf16" --streams "${LORA_STREAMS:-64}" --gen 128 --runs 2 \
        2>&1 | tee "$out/bench_lora.log" | grep -v '^  |'
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
      # A build packed by an earlier call (LLAMA_PACK=1, carried back as .device/llama-bin-*).
      if [ ! -x "$bin/llama-quantize" ] && ls .device/llama-bin-"$cuda".txz.* > /dev/null 2>&1; then
        mkdir -p "$bin" && cat .device/llama-bin-"$cuda".txz.* | tar -xJ -C "$bin" &&
          echo "llama.cpp unpacked from .device/llama-bin-$cuda.txz.*"
      fi
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
        # LLAMA_PACK=1: the build's bin folder (programs and shared libraries, whose run paths
        # name this folder) into $PACK_DIR (default $out) in parts of 15 MB, to carry next time.
        [ -z "${LLAMA_PACK:-}" ] || tar -C "$bin" -c . | xz -T0 -6 |
          split -b 15M - "${PACK_DIR:-$out}/llama-bin-$cuda.txz."
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
            # product), q8blocks (LATTICE_CUDA_Q8=blocks: Q8_0 decode in the block kernel), old
            # (.device/lattice-old, an earlier build packed beside it).
            exe=.device/lattice
            case $kern in
              gemv) env=LATTICE_CUDA_QUANT=gemv ;;
              q8blocks) env=LATTICE_CUDA_Q8=blocks ;;
              old) env= exe=.device/lattice-old ;;
              *) env= ;;
            esac
            env $env "$exe" bench generate --model "$f" --device cuda \
              --prompt-tokens 512 --gen-tokens 128 --runs "${RUNS:-5}" --streams "$streams" \
              --json 2>&1 | tee "$out/lattice_${q}_${kern}_s$streams.json" | grep -v '^bench: run'
          done
        done
      done
      # The same files on the GPU against the CPU (logits, greedy); GGUF_PARITY=0 skips it.
      [ "${GGUF_PARITY:-1}" = 0 ] || LATTICE_TEST_GGUF=$(ls "$models"/qwen3-0.6b-Q*.gguf | tr '\n' ,) .device/cuda_parity \
        quantized_gguf --nocapture 2>&1 | tee "$out/gguf_parity.log" | grep -vE '^$'
      ;;
    ncu64)
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
      [ -n "$ncu" ] || { echo "ncu64: no ncu here"; continue; }
      timeout "${NCU_TIMEOUT:-240}" "$ncu" --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        .device/lattice bench generate --model "$models/qwen3-0.6b-bf16" ${NCU_FLAGS:---bf16} \
        --device cuda --prompt-tokens 16 --gen-tokens 4 --runs 1 --streams 64 \
        > "$out/ncu64${NCU_TAG:-}.csv" 2> "$out/ncu64${NCU_TAG:-}.err"
      python3 scripts/gpu/ncu_summary.py "$out/ncu64${NCU_TAG:-}.csv" |
        tee "$out/ncu64${NCU_TAG:-}.txt" | head -40
      ;;
    ncu1)
      # Batch-1 decode, kernel by kernel: `lattice bench generate` of NCU_MODEL (default the bf16
      # Qwen3-0.6B shape, with --bf16; a GGUF runs as it is) and, for a GGUF after the gguf step,
      # llama-bench on the same file (8 generated tokens, no prompt), each summed per kernel and
      # grid into $out/ncu1_lattice.txt and $out/ncu1_llama.txt.
      ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
      [ -n "$ncu" ] || { echo "ncu1: no ncu here"; continue; }
      m=${NCU_MODEL:-$models/qwen3-0.6b-bf16}
      flags=--bf16
      case $m in *.gguf) flags= ;; esac
      # shellcheck disable=SC2086
      timeout "${NCU_TIMEOUT:-240}" "$ncu" --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        .device/lattice bench generate --model "$m" $flags --device cuda \
        --prompt-tokens 16 --gen-tokens 8 --runs 1 > "$out/ncu1_lattice.csv" 2> "$out/ncu1.err"
      python3 scripts/gpu/ncu_summary.py "$out/ncu1_lattice.csv" | tee "$out/ncu1_lattice.txt" | head -30
      llama=/tmp/llama.cpp/build-cuda1/bin/llama-bench
      case $m in
        *.gguf) [ -x "$llama" ] && timeout "${NCU_TIMEOUT:-240}" "$ncu" --clock-control none --csv \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
          "$llama" -m "$m" -ngl 99 -p 0 -n 8 -r 1 > "$out/ncu1_llama.csv" 2>> "$out/ncu1.err" &&
          python3 scripts/gpu/ncu_summary.py "$out/ncu1_llama.csv" | tee "$out/ncu1_llama.txt" | head -30 ;;
      esac
      ;;
    fullsize)
      # Full-size random checkpoints, transformers (f32, TF32 off) against Lattice on the same
      # GPU: Qwen3-0.6B in f32 and its bf16 checkpoint (the same values) in --bf16 mode; the
      # Qwen3.5-0.8B shape (bf16 values, f32 reference) likewise when transformers here has it.
      refs=
      python3 scripts/gpu/torch_logits.py --model "$models/qwen3-0.6b-f32" --dtype f32 \
        --device cuda --out "$out/ref_qwen3_f32.json" 2>&1 | tail -1 &&
        refs="f32:$models/qwen3-0.6b-f32=$out/ref_qwen3_f32.json,bf16:$models/qwen3-0.6b-bf16=$out/ref_qwen3_f32.json"
      if [ -f "$models/qwen35-0.8b-bf16/config.json" ]; then
        python3 scripts/gpu/torch_logits.py --model "$models/qwen35-0.8b-bf16" --dtype f32 \
          --device cuda --id-max 248044 --out "$out/ref_qwen35_f32.json" 2>&1 | tail -1 &&
          refs="$refs,bf16:$models/qwen35-0.8b-bf16=$out/ref_qwen35_f32.json,f32:$models/qwen35-0.8b-bf16=$out/ref_qwen35_f32.json"
      fi
      LATTICE_TEST_TORCH_REF="$refs" .device/cuda_parity full_size --nocapture --test-threads=1 2>&1 |
        tee "$out/fullsize.log" | grep -vE '^$'
      ;;
    fullbert|embedspeed)
      # A full-size BERT (all-MiniLM-L6-v2's config and tokenizer, carried as .device/minilm
      # without model.safetensors; random weights drawn here by transformers' BertModel init,
      # seed 0) on the STS-B dev sentences (.device/stsb-en-dev.csv): sentence-transformers f32 on
      # the GPU against `lattice embed` on the GPU and on the CPU, and with --bf16 on the GPU,
      # 1 - cos per sentence. `embedspeed` first times sentence-transformers fp16 on the GPU
      # against `lattice bench --device cuda` (f32 and --bf16), three alternating rounds.
      [ -f .device/minilm/model.safetensors ] || python3 - <<'PY'
import torch
from transformers import BertConfig, BertModel
torch.manual_seed(0)
m = BertModel(BertConfig.from_pretrained(".device/minilm"), add_pooling_layer=False).eval()
m.save_pretrained(".device/minilm", safe_serialization=True)
PY
      if [ "$step" = embedspeed ]; then
        for r in 1 2 3; do
          python3 scripts/gpu/st_embed.py --model .device/minilm --sentences .device/stsb-en-dev.csv \
            --batch 128 --runs 3 --dtype fp16 2>/dev/null | tail -n 1
          for mode in "" --bf16; do
            .device/lattice bench --model .device/minilm --data .device/stsb-en-dev.csv --device cuda \
              --batch 128 --runs 3 --latency-samples 20 $mode 2>/dev/null
          done
        done | tee "$out/embedspeed.jsonl" | python3 -c "
import json, sys
for l in sys.stdin:
    try:
        r = json.loads(l)
    except ValueError:
        continue
    print(r.get('engine', 'sentence-transformers'), r.get('weights', r.get('dtype')),
          round(r.get('sentences_per_s', r.get('sentences_per_s_median', 0)), 1), 'sent/s')"
      fi
      python3 scripts/gpu/st_embed.py --model .device/minilm --sentences .device/stsb-en-dev.csv \
        --batch 128 --runs 1 --dtype f32 --dump-n 2910 --dump "$out/st_f32.json" > /dev/null 2>&1
      OUT=$out python3 - <<'PY'
import json, os, subprocess
import numpy as np
rows = json.load(open(os.environ["OUT"] + "/st_f32.json"))["items"]
with open("/tmp/texts.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps({"text": r["text"]}) + "\n")
ref = np.array([r["embedding"] for r in rows], dtype=np.float64)
for dev, flags in [("cuda", []), ("cpu", []), ("cuda", ["--bf16"])]:
    out = subprocess.run([".device/lattice", "embed", "--model", ".device/minilm", "--device", dev,
                          "--input", "/tmp/texts.jsonl", *flags], capture_output=True, text=True, check=True)
    got = np.array([json.loads(l)["embedding"] for l in out.stdout.splitlines()], dtype=np.float64)
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"lattice --device {dev} {' '.join(flags)} vs sentence-transformers f32: {len(rows)} sentences, "
          f"1 - cos max {1 - cos.min():.2e} mean {np.mean(1 - cos):.2e}")
PY
      ;;
    torch)
      python3 scripts/gpu/torch_bench.py --model "$models/qwen3-0.6b-bf16" --device cuda \
        --out "$out/torch_bench.json" ${BENCH_ARGS:---sections prefill,eager} 2>&1 | tail -40
      ;;
  esac
done
echo "== done ($(date +%T))"
