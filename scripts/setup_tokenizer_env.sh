#!/usr/bin/env bash
# Creates the small Python environments the tokenizer reference generators use (git-ignored, only
# needed to REGENERATE the committed tokenizer references; tests need no Python):
#   .cache/venv-tok  HF tokenizers 0.23.3: scripts/gen_tokenizer_reference.py,
#                    scripts/gen_bpe_reference.py, scripts/gen_unigram_json_reference.py
#   .cache/venv-sp   sentencepiece 0.2.3 (+ protobuf): scripts/gen_sentencepiece_reference.py
#                    (made by scripts/fetch_sentencepiece.sh --with-venv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.cache/venv-tok"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "tokenizers==0.23.3"
"$root/scripts/fetch_sentencepiece.sh" --with-venv
echo "venv-tok and venv-sp ready" >&2
