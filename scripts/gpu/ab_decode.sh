#!/usr/bin/env bash
# A/B of the CUDA decode path on the device: two `lattice` binaries (OLD, NEW) alternating on the
# random Qwen3-0.6B bf16 checkpoint (scripts/gpu/make_models.py), with nothing else running on
# the host (the decode step's host pass shares the CPU: a concurrent build slows it). Carry
# .device/ with both stripped binaries and qwen3-tokenizer/.
#   OLD=.device/lattice-old NEW=.device/lattice bash scripts/gpu/ab_decode.sh
set -u
cd "$(dirname "$0")/../.."
libdirs=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -maxdepth 8 \
  \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' \) 2>/dev/null |
  grep -v /stubs/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:-}"
M=${MODELS_DIR:-/tmp/gpu-models}
[ -f "$M/qwen3-0.6b-bf16/model.safetensors" ] ||
  python3 scripts/gpu/make_models.py --out "$M" --device cuda \
    --tokenizer .device/qwen3-tokenizer/tokenizer.json.gz > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
for r in 1 2; do
  for b in "${OLD:-.device/lattice-old}" "${NEW:-.device/lattice}"; do
    timeout 100 "$b" bench generate --model "$M/qwen3-0.6b-bf16" --bf16 --device cuda \
      --prompt-tokens 512 --gen-tokens 128 --runs 5 --streams 64 --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('$b', 'pp512', round(d['prompt_tokens_per_s']), 'tg128', round(d['gen_tokens_per_s'], 1), 'x64', round(d['batched_gen_tokens_per_s']))"
  done
done
