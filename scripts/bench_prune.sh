#!/usr/bin/env bash
# ShortGPT pruning table (issue 21): Qwen2.5-Coder-0.5B-Instruct GGUF (scripts/fetch_models.sh)
# pruned by `lattice prune` (block influence over the second half of Moby-Dick, bytes 600,001
# to the end, 2,048 tokens) for each K in KS, then `lattice perplexity` on the first 600,000
# bytes (CHUNKS chunks of 512) and `lattice bench generate` (pp/tg) of each file; llama.cpp's
# llama-perplexity on the same pruned files when built (scripts/build_llama_cpp.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-.cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf}
text=$(./scripts/fetch_text.sh)
out=${OUT:-.cache/prune}
mkdir -p "$out"
head -c 600000 "$text" > "$out/eval.txt"
tail -c +600001 "$text" > "$out/calibration.txt"
lscpu | grep -m1 'Model name'
cargo build --release -q -p lattice-cli
bin=target/release/lattice
llama=.cache/llama.cpp/build/bin/llama-perplexity
for k in ${KS:-0 2 4 6}; do
  f="$out/pruned-$k.gguf"
  if [ "$k" = 0 ]; then f=$model; else
    $bin prune --model "$model" --calibration "$out/calibration.txt" --remove "$k" \
      --calibration-tokens 2048 --threads 2 --json "$f" 2>/dev/null > "$out/prune-$k.json"
  fi
  ppl=$($bin perplexity --model "$f" --text "$out/eval.txt" --ctx 512 --chunks "${CHUNKS:-8}" \
    --threads 2 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(f\"{d['ppl']:.4f} +/- {d['ppl_error']:.4f}\")")
  peer=-
  [ -x "$llama" ] && peer=$($llama -m "$f" -f "$out/eval.txt" -c 512 --chunks "${CHUNKS:-8}" -t 2 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  speed=$($bin bench generate --model "$f" --prompt-tokens 128 --gen-tokens 32 --runs 3 --threads 2 \
    --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(round(d['prompt_tokens_per_s'], 1), round(d['gen_tokens_per_s'], 1))")
  removed=$([ "$k" = 0 ] && echo "[]" || python3 -c "import json; print(json.load(open('$out/prune-$k.json'))['removed'])")
  echo "K=$k removed=$removed size=$(stat -c %s "$f") ppl=$ppl llama-perplexity=$peer pp128/tg32=$speed"
done
