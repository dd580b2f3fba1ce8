#!/usr/bin/env bash
# Builds the peer engine, llama.cpp, for the GGUF generation references and benchmarks
# (scripts/gen_gguf_reference.py, scripts/bench_generate.sh). Everything lands in the git-ignored
# cache; nothing is committed. Safe to re-run: finished steps are skipped.
#
#   .cache/llama.cpp/src/     llama.cpp as vendored by the llama-cpp-python 0.3.36 sdist
#   .cache/llama.cpp/build/   CMake build (Release, GGML_NATIVE=ON, shared libraries);
#                             bin/ holds llama-bench, llama-completion, llama-simple, llama-perplexity, llama-quantize,
#                             llama-tokenize and libllama.so / libggml*.so
#   .cache/venv-llama/        cmake + ninja (from PyPI), numpy and llama-cpp-python 0.3.36
#
# The Python bindings are installed from the same sdist without compiling llama.cpp a second time
# (CMAKE_ARGS=-DLLAMA_BUILD=OFF); they load this build's libllama.so through LLAMA_CPP_LIB_PATH,
# which scripts/gen_gguf_reference.py sets. So the CLI tools and the Python reference run the very
# same native build. Set LLAMA_PY_SELF_BUILD=1 to have pip compile its own copy instead (the
# upstream default; another ~15 minutes on 2 cores).
#
# Environment: JOBS (default 2) parallel compile jobs; WITH_CLI=1 also builds llama-cli (the new
# chat CLI, which pulls in the whole server and doubles the build time).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cache="$root/.cache"
dl="$cache/pypi"
sdist="$dl/llama_cpp_python-0.3.36.tar.gz"
src="$cache/llama.cpp/src"
build="$cache/llama.cpp/build"
venv="$cache/venv-llama"
jobs="${JOBS:-2}"

# 1. The sdist (same route as scripts/fetch_models.sh: PyPI's simple index, no build backend).
if [ ! -f "$sdist" ]; then
  echo "fetch: llama-cpp-python 0.3.36 sdist from PyPI" >&2
  mkdir -p "$dl"
  python3 - "$dl" <<'PY'
import os, re, sys, urllib.request
page = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-python/").read().decode()
url = re.search(r'href="([^"]*/llama_cpp_python-0\.3\.36\.tar\.gz)[^"]*"', page).group(1)
dest = os.path.join(sys.argv[1], "llama_cpp_python-0.3.36.tar.gz")
if not os.path.exists(dest):
    urllib.request.urlretrieve(url, dest + ".part")
    os.replace(dest + ".part", dest)
PY
fi

# 2. Tool venv: cmake and ninja come from PyPI (the system may have neither).
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "cmake>=3.21" ninja "numpy>=1.20" "scikit-build-core>=0.9.2"
fi
export PATH="$venv/bin:$PATH"

# 3. Sources: vendor/llama.cpp of the sdist.
if [ ! -f "$src/CMakeLists.txt" ]; then
  echo "extract: vendor/llama.cpp -> $src" >&2
  mkdir -p "$src"
  tar -xzf "$sdist" -C "$src" --strip-components=3 llama_cpp_python-0.3.36/vendor/llama.cpp
fi

# 4. Native build of the tools (and the shared libraries the Python bindings load).
# NO_AMX=1: llama-bench only, into build-noamx/, compiled without AMX (-mno-amx-*): on Xeons
# with AMX, the native build's AMX-INT8 path dies with SIGILL on quantized models in these VMs.
native_flags=()
targets=(llama-bench llama-completion llama-simple llama-tokenize llama-perplexity llama-quantize)
if [ "${NO_AMX:-0}" = 1 ]; then
  build="$cache/llama.cpp/build-noamx"
  targets=(llama-bench)
  native_flags=(-DCMAKE_C_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    -DCMAKE_CXX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
if [ "${WITH_CLI:-0}" = 1 ]; then targets+=(llama-cli); fi
# WITH_MTMD=1: the multimodal CLI (vision towers from an mmproj GGUF), the image peer.
if [ "${WITH_MTMD:-0}" = 1 ]; then targets+=(llama-mtmd-cli); fi
missing=0
for t in "${targets[@]}"; do [ -x "$build/bin/$t" ] || missing=1; done
[ -f "$build/bin/libllama.so" ] || missing=1
if [ "$missing" = 1 ]; then
  # (Re)configure: cheap when the cache exists, and needed when WITH_CLI changes.
  cmake -S "$src" -B "$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON "${native_flags[@]}" \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_SERVER="$([ "${WITH_CLI:-0}" = 1 ] && echo ON || echo OFF)"
  cmake --build "$build" -j "$jobs" --target "${targets[@]}"
else
  echo "skip: llama.cpp tools already built in $build/bin" >&2
fi

# 5. Python bindings (same sdist) + numpy for scripts/gen_gguf_reference.py.
if ! "$venv/bin/python" -c 'import importlib.metadata as m; assert m.version("llama_cpp_python") == "0.3.36"' 2>/dev/null; then
  if [ "${LLAMA_PY_SELF_BUILD:-0}" = 1 ]; then
    cmake_args="-DGGML_NATIVE=ON -DLLAMA_CURL=OFF"
  else
    cmake_args="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF"
  fi
  echo "pip: llama-cpp-python 0.3.36 from the sdist (CMAKE_ARGS=$cmake_args)" >&2
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$sdist"
fi

echo "llama.cpp tools: $build/bin ($(cd "$build/bin" && ls llama-* | tr '\n' ' '))"
echo "python: $venv/bin/python (LLAMA_CPP_LIB_PATH=$build/bin unless LLAMA_PY_SELF_BUILD=1)"
