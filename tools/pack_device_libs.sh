#!/usr/bin/env bash
# Copies into .deps/lib the shared libraries that binaries built here
# (Debian 12) load and the GPU machine's image (Ubuntu 24.04) lacks in these
# versions: spdlog 1.10, fmt 9, utf8proc 2 and Open MPI's C++ bindings. With
# them on LD_LIBRARY_PATH there, tools/gpu_check_prebuilt.sh runs the binaries
# built here (carry .deps/lib and the binaries). Checks that the binary given
# (default build/lockstep) finds every library it names from .deps/lib.
#   tools/pack_device_libs.sh [BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/lockstep}
mkdir -p .deps/lib
for name in libspdlog.so.1.10 libfmt.so.9 libutf8proc.so.2 libmpi_cxx.so.40; do
  path=$(ldd "$bin" | awk -v n="$name" '$1 == n {print $3}')
  [[ -z "$path" ]] && { echo "$bin does not load $name: nothing copied for it"; continue; }
  cp -L "$path" ".deps/lib/$name"
done
if LD_LIBRARY_PATH=.deps/lib ldd "$bin" | grep "not found"; then exit 1; fi
ls -l .deps/lib
