# Sourced by the device scripts (lattice_device.sh, ab_decode.sh, serve_tests.sh) from the repo
# root: unpacks the binaries scripts/gpu/pack_device.sh packed into .device/bins.txz (again
# whenever the archive differs from the one unpacked last: a warm machine keeps the last call's
# files), and puts the CUDA libraries (cuBLAS, cuBLASLt, NVRTC; not the driver stubs) on
# LD_LIBRARY_PATH.
if [ -f .device/bins.txz ]; then
  packed=$(md5sum < .device/bins.txz)
  if [ "$packed" != "$(cat .device/.unpacked 2> /dev/null)" ]; then
    tar -C .device -xJf .device/bins.txz && echo "$packed" > .device/.unpacked
  fi
fi
libdirs=$(find /usr/local/cuda* /usr/lib/x86_64-linux-gnu /opt /usr/local/lib -maxdepth 8 \
  \( -name 'libcublas.so*' -o -name 'libnvrtc.so*' -o -name 'libcublasLt.so*' \) 2>/dev/null |
  grep -v /stubs/ | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:-}"
