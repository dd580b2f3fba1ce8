#!/usr/bin/env bash
# Creates (or updates) the Python reference environment in .cache/venv-ref (git-ignored).
#
# Only needed to REGENERATE the committed test fixtures and references, or to run the ONNX Runtime
# speed peer; building and testing Lattice needs no Python at all:
#   scripts/gen_fixtures.py        tiny random-weight checkpoints -> crates/inference/tests/fixtures/
#   scripts/gen_real_reference.py  real-model references          -> crates/embed/tests/fixtures/real/
#   scripts/export_onnx.py         real models -> .cache/onnx/<model>.onnx
#   scripts/bench_ort.py           ONNX Runtime throughput/latency on STS-B dev
#
# Versions are pinned so that regenerated fixtures are bit-comparable. torch comes from PyPI (the
# default build pulls CUDA wheels, ~6 GB; everything here runs on the CPU). Safe to re-run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.cache/venv-ref"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "torch==2.15.0" \
  "transformers==5.24.0" \
  "sentence-transformers==6.2.0" \
  "tokenizers==0.23.3" \
  "safetensors==0.8.0" \
  "onnxruntime==1.32.0" \
  "onnx==1.23.2" \
  "scipy==1.17.1" \
  "numpy==2.4.6" \
  "gguf==0.19.0" \
  "jinja2==3.1.6"
# transformers loads GGUF files (gguf_file=) through accelerate, which needs psutil.
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
  "accelerate==1.12.0" "psutil==7.2.2"
"$venv/bin/python" -c "import torch, transformers, sentence_transformers, tokenizers, onnxruntime; \
print('venv-ref ok: torch', torch.__version__, 'transformers', transformers.__version__, \
'sentence-transformers', sentence_transformers.__version__, 'onnxruntime', onnxruntime.__version__)"
