#!/usr/bin/env bash
# QuaRot table (issue 21): Qwen2.5-Coder-0.5B-Instruct GGUF (scripts/fetch_models.sh),
# dequantized, re-quantized by `lattice quantize --method M` for each M in METHODS, and by
# llama.cpp's llama-quantize (from the f32 file) for each type in LLAMA_TYPES; then `lattice
# perplexity` over the first 600,000 bytes of Moby-Dick (CHUNKS chunks of 512, the text of
# scripts/bench_prune.sh), llama-perplexity on the files llama.cpp reads (every method without
# `-online`), and `lattice bench generate` pp512 / tg32 of each file (SPEED=0: skipped). One line
# per file. REUSE=1 keeps files already made. A method `M:gptq` is M with GPTQ rounding, calibrated
# on the rest of Moby-Dick (the lines after the evaluation text; CAL_TOKENS tokens, default 16384),
# written as `M-gptq.gguf`.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-.cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf}
text=$(./scripts/fetch_text.sh)
out=${OUT:-.cache/quarot}
mkdir -p "$out"
head -c 600000 "$text" > "$out/eval.txt"
# The calibration text starts at the first whole line after the evaluation text.
tail -c +600001 "$text" | tail -n +2 > "$out/calibration.txt"
grep -m1 'model name' /proc/cpuinfo
cargo build --release -q -p lattice-cli
bin=target/release/lattice
bindir=.cache/llama.cpp/build/bin
[ -f "$out/f32.gguf" ] || $bin quantize --method f32 "$model" "$out/f32.gguf" 2>/dev/null
files=""
for spec in ${METHODS:-f32 q8_0 q4_0 q4_1 quarot-w4a8 quarot-w4a8-sym quarot-w4a8-online quarot-w4a8-sym-online quarot-w4a8:gptq quarot-w4a8-sym:gptq}; do
  m=${spec%%:*}
  name=$m
  args=${ROUNDING:+--rounding $ROUNDING}
  if [ "$spec" != "$m" ]; then
    name="$m-${spec#*:}"
    args="--rounding ${spec#*:} --calibration $out/calibration.txt --calibration-tokens ${CAL_TOKENS:-16384}"
  fi
  [ "$m" = f32 ] || [ -n "${REUSE:-}" -a -f "$out/$name.gguf" ] ||
    $bin quantize --method "$m" $args "$model" "$out/$name.gguf" 2>"$out/$name.log"
  files="$files $name"
done
for t in ${LLAMA_TYPES:-Q4_0 Q4_K_S Q4_K_M}; do
  [ -n "${REUSE:-}" -a -f "$out/llama-$t.gguf" ] ||
    "$bindir/llama-quantize" "$out/f32.gguf" "$out/llama-$t.gguf" "$t" >/dev/null 2>&1
  files="$files llama-$t"
done
for name in $files; do
  f="$out/$name.gguf"
  ppl=$($bin perplexity --model "$f" --text "$out/eval.txt" --ctx 512 --chunks "${CHUNKS:-8}" \
    --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"{d['ppl']:.4f} +/- {d['ppl_error']:.4f}\")" || echo "n/a (Lattice cannot load it)")
  peer=-
  case "$name" in *online*) ;; *)
    peer=$("$bindir/llama-perplexity" -m "$f" -f "$out/eval.txt" -c 512 --chunks "${CHUNKS:-8}" -t 2 2>&1 |
      sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p') ;;
  esac
  speed=-
  if [ "${SPEED:-1}" != 0 ] && [ "$name" != f32 ]; then
    speed=$($bin bench generate --model "$f" --prompt-tokens 512 --gen-tokens 32 --runs 3 --threads 2 \
      --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['prompt_tokens_per_s'], 1), round(d['gen_tokens_per_s'], 1))" || echo n/a)
  fi
  echo "$name size=$(stat -c %s "$f") ppl=$ppl llama-perplexity=$peer pp512/tg32=$speed"
done
