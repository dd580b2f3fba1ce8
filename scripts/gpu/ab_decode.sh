#!/usr/bin/env bash
# A/B of the CUDA decode path on the device, variants alternating round by round on one model,
# with nothing else running on the host (the decode step's host pass shares the CPU: a
# concurrent build slows it). A variant is a binary and an environment:
#   OLD=.device/lattice-old NEW=.device/lattice bash scripts/gpu/ab_decode.sh     (two binaries)
#   VARIANTS="LATTICE_CUDA_PDL=0 LATTICE_CUDA_PDL=1" bash scripts/gpu/ab_decode.sh
# (each VARIANTS entry: comma-separated VAR=VALUE settings for .device/lattice, or for the
# binaries of BINS in turn, the last repeated). MODEL defaults
# to the random Qwen3-0.6B bf16 checkpoint of scripts/gpu/make_models.py (made if missing; carry
# .device/qwen3-tokenizer/), FLAGS to --bf16 for it; ROUNDS (2), STREAMS (64). With
# LATTICE_CUDA_TRACE=1 in a variant, the graph's device time per step is printed too (a batch-1
# step's, and the last traced step of the streams, replayed or eager, with the host pass's
# parts); with LATTICE_TRACE_STEPS=1, the engine's step by parts.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu/device_env.sh
M=${MODELS_DIR:-/tmp/gpu-models}
model=${MODEL:-$M/qwen3-0.6b-bf16}
flags=${FLAGS-"--bf16"}
[ -e "$model" ] || [ -n "${MODEL:-}" ] ||
  python3 scripts/gpu/make_models.py --out "$M" --device cuda \
    --tokenizer .device/qwen3-tokenizer/tokenizer.json.gz > /dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
if [ -n "${VARIANTS:-}" ]; then
  variants=$VARIANTS
  bins=${BINS:-.device/lattice}
else
  variants="- -"
  bins="${OLD:-.device/lattice-old} ${NEW:-.device/lattice}"
fi
echo "model $model flags $flags"
for r in $(seq "${ROUNDS:-2}"); do
  set -- $bins
  for v in $variants; do
    b=$1
    [ $# -gt 1 ] && shift
    env_args=()
    [ "$v" = - ] || IFS=, read -r -a env_args <<< "$v"
    # shellcheck disable=SC2086
    timeout 150 env "${env_args[@]}" "$b" bench generate --model "$model" $flags --device cuda \
      --prompt-tokens 512 --gen-tokens 128 --runs 5 --streams "${STREAMS:-64}" --json \
      2> /tmp/ab_err.log |
      python3 -c "import json,sys; d=json.load(sys.stdin); print('$b $v', 'pp512', round(d['prompt_tokens_per_s']), 'tg128', round(d['gen_tokens_per_s'], 1), 'streams', round(d['batched_gen_tokens_per_s']))"
    grep -m3 'replayed step of 1 rows' /tmp/ab_err.log | tail -1
    # The streams' steps: replayed from a graph (host pass, graph time) or run eagerly.
    grep -E "(replayed|eager) step of ${STREAMS:-64} rows" /tmp/ab_err.log | tail -1
    # With LATTICE_TRACE_STEPS=1: the engine's step by parts, averaged over 64 steps.
    grep "engine trace: 64 steps of ${STREAMS:-64}" /tmp/ab_err.log | tail -1
    grep -iE 'error|panick' /tmp/ab_err.log | head -3
  done
done
