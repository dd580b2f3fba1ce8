#!/usr/bin/env bash
# Here (no GPU, no CUDA toolkit): fetches nvcc 13.0 from PyPI (nvidia-cuda-nvcc, its crt headers,
# nvidia-nvvm's cicc, nvidia-cuda-runtime's headers and static runtime) into the git-ignored
# cache, so the device benches (scripts/gpu/*.cu that need no cuBLAS) build here and a device
# call carries the binary instead of compiling there. Prints the nvcc path. Safe to re-run.
#
#   nvcc=$(scripts/gpu/fetch_nvcc.sh)
#   $nvcc -O3 -std=c++17 -arch=sm_90 -o .device/ahead_bench scripts/gpu/ahead_bench.cu
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest="$root/.cache/nvcc13"
cu="$dest/nvidia/cu13"
if [ ! -x "$cu/nvvm/bin/cicc" ] || [ ! -f "$cu/include/crt/host_config.h" ]; then
  dl="$root/.cache/pypi"
  mkdir -p "$dl" "$dest"
  for pkg in nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
    nvidia-cuda-runtime==13.0.96; do
    echo "fetch: $pkg" >&2
    python3 -m pip download -q --no-deps --disable-pip-version-check --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 -d "$dl" "$pkg"
    name=${pkg%%==*}
    version=${pkg##*==}
    python3 -m zipfile -e "$dl/${name//-/_}-$version"-*.whl "$dest"
  done
  chmod +x "$cu"/bin/* "$cu"/nvvm/bin/*
fi
# nvcc finds its headers and libraries next to itself; the runtime's are added here.
cat > "$dest/nvcc" <<WRAP
#!/usr/bin/env bash
exec "$cu/bin/nvcc" -I"$cu/include" -L"$cu/lib" "\$@"
WRAP
chmod +x "$dest/nvcc"
echo "$dest/nvcc"
