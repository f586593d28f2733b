#!/usr/bin/env bash
# Runs `lockstep bench` on the llama3-8b preset (random weights generated in
# memory, the values make-model would write) and,
# unless --no-peer, the PyTorch peers (benchmarks/torch_peer.py) on the same
# shape, printing lockstep's tok/s over theirs. Needs a built lockstep.
#   benchmarks/run_bench.sh LOCKSTEP_BINARY OUT_DIR [--no-peer] [extra bench args]
set -uo pipefail
L=$1; OUT=$2; shift 2
PEER=1
if [ "${1:-}" = "--no-peer" ]; then PEER=0; shift; fi
HERE=$(cd "$(dirname "$0")" && pwd)
export NCCL_NVLS_ENABLE=0
"$L" bench --preset llama3-8b --batch 1,8,32,64 --ctx 1024 --steps "${STEPS:-128}" --json "$OUT/bench_8b.json" "$@" \
  2> "$OUT/bench_8b.log" | tee "$OUT/bench_8b.txt"
if [ "$PEER" = 1 ]; then
  PYTHONUNBUFFERED=1 python3 "$HERE/torch_peer.py" --batch 1,32 --ctx 1024 --steps "${STEPS:-128}" \
    --lockstep-json "$OUT/bench_8b.json" --json "$OUT/torch_peer.json" 2> "$OUT/torch_peer.log" | tee "$OUT/torch_peer.txt"
fi
