#!/usr/bin/env bash
# Here: builds the CUDA release binaries and packs what a device call carries into
# .device/bins.txz (xz; ~10-15 MB where the stripped files are ~30 MB): the working tree that
# travels with a call is limited to 64 MiB, and the tracked tree already takes a large part of
# it. On the device, `lattice_device.sh` and `ab_decode.sh` unpack .device/bins.txz into
# .device/ when it is there.
#
#   scripts/gpu/pack_device.sh [EXTRA...]
#
# Packs lattice, cuda_ops and cuda_parity (release, --features cuda, stripped), the Qwen3
# tokenizer (scripts/gpu/prepare_carry.py) and, when given, EXTRA files or folders (e.g. an
# older `lattice` renamed lattice-old for an A/B, or a Qwen3.5 tokenizer folder).
# CARGO_TARGET_DIR defaults to target/cuda. Then call `run` with carry [".device"].
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
cargo build --release -p lattice-cli --features cuda
tests=$(cargo test --release -p lattice-inference --features cuda --test cuda_ops --test cuda_parity \
  --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("cuda_ops", "cuda_parity"):
        print(m["target"]["name"], m["executable"])')
# (The file, not its folder: a run that failed half-way leaves the folder empty. The Qwen3
# tokenizer comes from scripts/fetch_models.sh's npm step.)
[ -f .cache/gpu-carry/qwen3-tokenizer/tokenizer.json.gz ] ||
  python3 scripts/gpu/prepare_carry.py --skip st,stsb >&2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$CARGO_TARGET_DIR/release/lattice" "$stage/"
while read -r name exe; do cp "$exe" "$stage/$name"; done <<< "$tests"
strip "$stage"/lattice "$stage"/cuda_ops "$stage"/cuda_parity
cp -r .cache/gpu-carry/qwen3-tokenizer "$stage/"
for extra in "$@"; do cp -r "$extra" "$stage/"; done
mkdir -p .device
rm -f .device/bins.txz
tar -C "$stage" -cJf .device/bins.txz .
ls -la .device/bins.txz >&2
