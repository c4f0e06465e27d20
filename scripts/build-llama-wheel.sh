#!/usr/bin/env bash
# Build the llama-cpp-python wheel once (it compiles llama.cpp: several minutes on 2 cores)
# and keep it in a cache folder, so later venvs install it in seconds.
# Usage: build-llama-wheel.sh PIP VERSION WHEEL_DIR
set -euo pipefail
pip=$1 version=$2 dir=$3
mkdir -p "$dir"
if compgen -G "$dir/llama_cpp_python-$version-*.whl" >/dev/null; then
  exit 0
fi
echo "building llama-cpp-python $version (compiles llama.cpp, about 7 minutes, once; cached in $dir)" >&2
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
# Portable CPU code: the cached wheel may be installed on another machine of the same kind.
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}"
"$pip" wheel -q --no-deps "llama-cpp-python==$version" -w "$dir"
