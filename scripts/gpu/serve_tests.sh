#!/usr/bin/env bash
# On the device: the server's integration tests (crates/cli/tests/serve.rs, serve_outputs.rs)
# with generation on the GPU (LATTICE_TEST_DEVICE=cuda), as scripts/gpu/README.md describes.
# Carried: .device/serve.txz (the two test binaries, built here with
# `CARGO_TARGET_DIR=target/cuda cargo test --release -p lattice-cli --features cuda --test serve
# --test serve_outputs --no-run`, stripped), .device/bins.txz (scripts/gpu/pack_device.sh: the
# `lattice` they start) and the openai wheels in .device/wheels. Needs the random
# qwen3-0.6b-f32 checkpoint of lattice_device.sh's `models` step. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
models=${MODELS_DIR:-/tmp/gpu-models}
mkdir -p "$out"
. scripts/gpu/device_env.sh
[ -x .device/serve ] || tar -C .device -xJf .device/serve.txz
# The test binaries have this checkout's paths built in.
mkdir -p /work && [ -e /work/main ] || ln -sfn "$PWD" /work/main
mkdir -p target/cuda/release && cp .device/lattice target/cuda/release/
python3 -m pip install -q --no-index --find-links .device/wheels --target /tmp/pylib openai
export PYTHONPATH=/tmp/pylib LATTICE_TEST_DEVICE=cuda
export LATTICE_TEST_SLOW_MODEL="$models/qwen3-0.6b-f32"
export LATTICE_TEST_EMBED_MODEL="$PWD/crates/inference/tests/fixtures/tiny-bert"
LATTICE_TEST_PYTHON=$(command -v python3)
export LATTICE_TEST_PYTHON
for t in ${SERVE_TESTS:-serve serve_outputs}; do
  echo "== $t ($(date +%T))"
  timeout "${SERVE_TIMEOUT:-240}" ".device/$t" --test-threads=1 > "$out/$t.log" 2>&1
  echo "rc $?"
  grep -E '^test |test result' "$out/$t.log"
done
