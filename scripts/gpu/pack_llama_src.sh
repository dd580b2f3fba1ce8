#!/usr/bin/env bash
# Packs the llama.cpp sources vendored by the llama-cpp-python 0.3.36 sdist into
# .device/llama-src.tar.gz (~6 MB), small enough to carry to the GPU machine (the whole sdist is
# 74 MB): docs, vocab models, tests, examples, the web UI and every ggml backend but CPU and CUDA
# are left out (none of them is configured with the flags lattice_device.sh's `gguf` step uses).
# The sdist is fetched by scripts/build_llama_cpp.sh into .cache/pypi/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
sdist="$root/.cache/pypi/llama_cpp_python-0.3.36.tar.gz"
[ -f "$sdist" ] || { echo "pack_llama_src: $sdist missing (run scripts/build_llama_cpp.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$sdist" -C "$tmp" --strip-components=2 llama_cpp_python-0.3.36/vendor/llama.cpp
src="$tmp/llama.cpp"
rm -rf "$src"/{docs,models,media,.github,benches,examples,tests} "$src"/tools/ui \
  "$src"/tools/server/webui "$src"/tools/server/public*
for b in cann et hexagon hip metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn rpc blas; do
  rm -rf "$src/ggml/src/ggml-$b"
done
mkdir -p "$root/.device"
tar -czf "$root/.device/llama-src.tar.gz" -C "$tmp" llama.cpp
ls -la "$root/.device/llama-src.tar.gz"
