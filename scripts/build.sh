#!/usr/bin/env bash
# Configures and builds into build/ (CUDA when nvcc is found: LOCKSTEP_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
