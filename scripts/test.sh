#!/usr/bin/env bash
# Runs every test: fetches the real models (cached after the first run), checks formatting and
# lints, then runs the whole workspace's tests in release mode (the real-model parity tests
# need optimized kernels to finish quickly).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch_models.sh
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets -- -D warnings
cargo test --release --workspace
