#!/usr/bin/env bash
# Runs every test: fetches the real models (cached after the first run), checks formatting and
# lints, then runs the whole workspace's tests in release mode (the real-model parity tests
# need optimized kernels to finish quickly), then the Python package's pytest suite. Ends with one
# "N passed, N failed" line.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch_models.sh
./scripts/fetch_sentencepiece.sh
./scripts/fetch_text.sh > /dev/null
# NVRTC (and ptxas) let the CUDA kernels compile here; without them that one test says SKIPPED.
nvrtc=$(./scripts/fetch_nvrtc.sh || echo "fetch of NVRTC failed" >&2)
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
# The CUDA backend builds everywhere (its libraries load at run time): lint it, and run its tests,
# which compile the kernels with NVRTC and say SKIPPED for what needs a GPU.
cargo clippy --release --workspace --all-targets --features lattice-cli/cuda -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --lib --bins --tests 2>&1 | tee "$log" || status=$?
LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LATTICE_PTXAS="$nvrtc/../bin/ptxas" \
  cargo test --release -p lattice-inference --features cuda --test cuda_ops --test cuda_parity \
  -- --nocapture 2>&1 | tee -a "$log" || status=$?
# f16 decode attention keeps as many loads in flight as the f32 one: a slowdown only a GPU would
# feel (2.7x at 64 rows, 2026-12-06), seen here in the kernels' SASS.
if [ -n "$nvrtc" ]; then
  python3 scripts/gpu/kernel_sass.py --check 2>&1 | tail -1 || status=$?
else
  echo "kernel_sass check: SKIPPED (no NVRTC)"
fi
# Each fuzz target for a short time on its committed corpus (libFuzzer, nightly; the long runs
# with AddressSanitizer are recorded in docs/reliability.md). Without a sanitizer here: the
# build is the cost, and the corpus replay above already runs every input on stable.
FUZZ_SANITIZER=none ./scripts/fuzz.sh 10 2>&1 | tee -a "$log" || status=$?
# The Python package (`import lattice`): built into .cache/venv-python and tested with pytest.
./scripts/test_python.sh 2>&1 | tee -a "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"
