#!/usr/bin/env bash
# Fetches NVIDIA's run-time CUDA compiler (NVRTC 13.0, PyPI nvidia-cuda-nvrtc) into the git-ignored
# cache, so machines without a GPU or CUDA toolkit (CI, the dev VM) still compile the CUDA
# backend's kernels (tests/cuda_ops.rs `kernels_compile_with_nvrtc`), and ptxas from the same
# release (PyPI nvidia-cuda-nvcc), which that test runs on the PTX (LATTICE_PTXAS) to catch
# inline-assembly and register errors a GPU would only report when it loads the module. Prints
# the folder to put on LD_LIBRARY_PATH. Safe to re-run.
#
#   .cache/nvrtc/nvidia/cu13/lib/libnvrtc.so.13 (+ its builtins)
#   .cache/nvrtc/nvidia/cu13/bin/ptxas
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/nvrtc"
lib="$dest/nvidia/cu13/lib"
if [ ! -f "$lib/libnvrtc.so.13" ]; then
  echo "fetch: NVRTC 13.0 (PyPI nvidia-cuda-nvrtc 13.0.88, 90 MB)" >&2
  dl="$root/.cache/pypi"
  mkdir -p "$dl" "$dest"
  python3 -m pip download -q --no-deps --disable-pip-version-check --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
    -d "$dl" "nvidia-cuda-nvrtc==13.0.88"
  python3 -m zipfile -e "$dl"/nvidia_cuda_nvrtc-13.0.88-*.whl "$dest"
fi
if [ ! -x "$dest/nvidia/cu13/bin/ptxas" ]; then
  echo "fetch: ptxas 13.0 (PyPI nvidia-cuda-nvcc 13.0.88, 37 MB)" >&2
  dl="$root/.cache/pypi"
  python3 -m pip download -q --no-deps --disable-pip-version-check --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
    -d "$dl" "nvidia-cuda-nvcc==13.0.88"
  python3 - "$dl" "$dest" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "nvidia_cuda_nvcc-13.0.88-*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    path = z.extract("nvidia/cu13/bin/ptxas", sys.argv[2])
os.chmod(path, 0o755)
PY
fi
echo "$lib"
