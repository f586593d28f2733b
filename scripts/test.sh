#!/usr/bin/env bash
# The second README command (and what CI runs): installs what is missing,
# builds, fetches the tokenizer test files, and runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/deps.sh
bash scripts/build.sh
if [[ -f scripts/fetch_tokenizers.sh ]]; then bash scripts/fetch_tokenizers.sh build/tokenizers; fi
cd build
ctest --output-on-failure -j 2 --timeout 900
