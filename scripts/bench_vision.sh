#!/usr/bin/env bash
# Image encoding and time to first token: Lattice (`lattice bench vision`) beside llama.cpp's
# llama-mtmd-cli on the same random-weight Qwen3.5-0.8B-shaped checkpoint with its vision tower,
# a 448 x 448 image, alternating rounds on this machine.
#
#   scripts/bench_vision.sh [ROUNDS]        (default 3)
#
# Needs: .cache/models/qwen35-0.8b-vl-random (scripts/gen_random_qwen35.py --vision, after
# scripts/fetch_models.sh made the Qwen3.5 tokenizer), llama.cpp with the multimodal CLI
# (WITH_MTMD=1 scripts/build_llama_cpp.sh), its GGUF files (made here with llama.cpp's converter
# if missing) and target/release/lattice. llama.cpp's figures come from its log: the "mtmd batch
# encoding done in N ms" line (the tower), and from its timestamps the span from the start of the
# prompt to the start of the last text chunk (a lower bound of its time to first token: the last
# 12-token chunk and the first sample are not in it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rounds="${1:-3}"
model="$root/.cache/models/qwen35-0.8b-vl-random"
gguf="$root/.cache/models/qwen35-vl-bf16.gguf"
mmproj="$root/.cache/models/qwen35-vl-mmproj-bf16.gguf"
image="$root/.cache/img448.png"
bin="$root/.cache/llama.cpp/build/bin"
py="$root/.cache/venv-ref/bin/python"
lattice="$root/target/release/lattice"
if [ ! -f "$image" ]; then
  "$py" - "$image" <<'PY'
import sys
import numpy as np
from PIL import Image
rng = np.random.default_rng(1)
y, x = np.mgrid[0:448, 0:448]
a = np.stack([x * 0.5, y * 0.5, (x + y) * 0.25], -1) + rng.normal(0, 20, (448, 448, 3))
Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(sys.argv[1])
PY
fi
[ -f "$gguf" ] || "$py" "$root/scripts/gen_qwen35_gguf.py" --model "$model" --outtype bf16 --outfile "$gguf"
if [ ! -f "$mmproj" ]; then
  PYTHONPATH="$root/.cache/llama.cpp/src/gguf-py" "$py" "$root/.cache/llama.cpp/src/convert_hf_to_gguf.py" \
    "$model" --mmproj --outtype bf16 --outfile "$mmproj"
fi
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(nproc) threads"
for r in $(seq "$rounds"); do
  for mode in "" "--bf16"; do
    echo "round $r: lattice $mode"
    "$lattice" bench vision --model "$model" --image "$image" --runs 3 $mode 2>/dev/null | tail -3
  done
  echo "round $r: llama.cpp"
  log=$(mktemp)
  LD_LIBRARY_PATH="$bin" "$bin/llama-mtmd-cli" -m "$gguf" --mmproj "$mmproj" --image "$image" \
    -p "What is in this picture?" -n 1 -t "$(nproc)" --temp 0 > "$log" 2>&1
  "$py" - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
enc = re.search(r"encoding done in (\d+) ms", text).group(1)
stamps = [l for l in text.splitlines() if re.match(r"^\d+\.\d+\.\d+\.\d+ ", l)]
def sec(l):
    _, s, ms = l.split()[0].split(".")[:3]
    return int(s) + int(ms) / 1000
start = sec(next(l for l in stamps if "main: loading model" in l))
last = sec([l for l in stamps if "find_slot" in l][-1])
print(f"| llama.cpp tower | {int(enc) / 1000:.3f} s |")
print(f"| llama.cpp prompt start to last text chunk (TTFT lower bound) | {last - start:.3f} s |")
PY
  rm -f "$log"
done
