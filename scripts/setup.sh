#!/usr/bin/env bash
# The first README command: installs what is missing, builds, writes the tiny
# default model and generates from it on 2 ranks under mpirun.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/deps.sh
bash scripts/build.sh
model=build/models/tiny-llama
[[ -f $model/tokenizer.json ]] || build/lockstep make-model --arch llama --preset tiny --out "$model"
echo "== mpirun -np 2 build/lockstep generate --model $model --prompt 'Once upon a time' --max-new-tokens 24"
mpirun -np 2 build/lockstep generate --model "$model" --prompt "Once upon a time" --max-new-tokens 24
