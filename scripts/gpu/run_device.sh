#!/usr/bin/env bash
# Runs the GPU reference steps on the device machine, from the repo root, writing results to $OUT.
#
#   bash scripts/gpu/run_device.sh STEP...      steps, in the order given:
#     models   make the random Qwen3-0.6B checkpoints (bf16 + f32) in $MODELS_DIR unless present
#     logits   torch_logits.py on both: $OUT/ref_f32.json, $OUT/ref_bf16.json
#     bench    torch_bench.py on the bf16 one: $OUT/torch_bench.json (extra flags: $BENCH_ARGS,
#              e.g. BENCH_ARGS="--sections prefill,eager" to split the run across calls)
#     embed    st_embed.py (fp16) on MiniLM and STS-B: $OUT/st_embed.json, $OUT/st_dump.json
#
# Inputs come from $CARRY (default .cache/gpu-carry, made here by scripts/gpu/prepare_carry.py and
# named in the device call's carry list). Environment: OUT (default /tmp/gpu-out), DEVICE (cuda),
# MODELS_DIR (/tmp/gpu-models), PYTHON (python3), TINY=1 (tiny shapes, for a local CPU test).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
dev=${DEVICE:-cuda}
carry=${CARRY:-.cache/gpu-carry}
models=${MODELS_DIR:-/tmp/gpu-models}
py=${PYTHON:-python3}
tiny=${TINY:-}
stem=qwen3-0.6b
[ -n "$tiny" ] && stem=qwen3-tiny
mkdir -p "$out"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

ensure_models() {
  if [ -f "$models/$stem-bf16/model.safetensors" ] && [ -f "$models/$stem-f32/model.safetensors" ]; then
    return
  fi
  local tok="$carry/qwen3-tokenizer/tokenizer.json.gz"
  [ -f "$tok" ] || tok="$carry/qwen3-tokenizer/tokenizer.json"
  "$py" scripts/gpu/make_models.py --out "$models" --device "$dev" --tokenizer "$tok" ${tiny:+--tiny}
}

[ $# -gt 0 ] || { sed -n '2,14p' "$0"; exit 2; }
for step in "$@"; do
  echo "== run_device: $step ($(date +%T))" >&2
  case "$step" in
    models) ensure_models ;;
    logits)
      ensure_models
      "$py" scripts/gpu/torch_logits.py --model "$models/$stem-f32" --dtype f32 --device "$dev" --out "$out/ref_f32.json"
      "$py" scripts/gpu/torch_logits.py --model "$models/$stem-bf16" --dtype bf16 --device "$dev" --out "$out/ref_bf16.json"
      ;;
    bench)
      ensure_models
      # shellcheck disable=SC2086
      "$py" scripts/gpu/torch_bench.py --model "$models/$stem-bf16" --device "$dev" --out "$out/torch_bench.json" ${BENCH_ARGS:-}
      ;;
    embed)
      "$py" scripts/gpu/st_embed.py --model "$carry/all-MiniLM-L6-v2-f16" --sentences "$carry/stsb/stsb-en-dev.csv" \
        --device "$dev" --out "$out/st_embed.json" --dump "$out/st_dump.json" ${EMBED_ARGS:-}
      ;;
    *) echo "run_device: unknown step $step" >&2; exit 2 ;;
  esac
done
echo "== run_device: done ($(date +%T))" >&2
