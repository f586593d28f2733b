#!/usr/bin/env bash
# The one device call that decides the two pending prefill patches (NOTES.md,
# the thirty-sixth and thirty-seventh sessions). Two halves:
#   bash benchmarks/pending/measure_prefill_patches.sh pack
#     (here, from a clean tree with build/ configured: builds the head, the head
#     with prefill_tile_order.patch, and that with prefill_unmasked_tiles.patch;
#     packs the stripped binaries, the runtime libraries the device lacks, the
#     kernel timeline and the tokenizers into .devcall/; leaves the tree clean
#     and build/ rebuilt at the head; about 5 minutes)
#   bash benchmarks/pending/measure_prefill_patches.sh device
#     (the device command: --no-pdl prefill timelines of the head and the
#     patch, the GPU tests of the tile-order build, decode and prefill at batch
#     1 and 32 of both, then the unmasked build's tests and timeline; the logs
#     are saved into $OUT/logs.tgz after each phase, since a machine can be
#     taken back mid-call)
set -u
cd "$(dirname "$0")/../.."
pack() {
  set -e
  git diff --quiet || { echo "the tree has changes: commit or stash them first"; exit 1; }
  trap 'git checkout -- kernels tests' EXIT  # a failed build leaves no patch applied
  source scripts/env.sh
  rm -rf .devcall && mkdir -p .devcall/stage/{head,tile,unmask}
  cmake --build build -j2 --target lockstep lockstep_tests kernel_timeline
  cp build/lockstep build/lockstep_tests .devcall/stage/head/
  cp build/libkernel_timeline.so .devcall/stage/
  git apply benchmarks/pending/prefill_tile_order.patch
  cmake --build build -j2 --target lockstep lockstep_tests
  cp build/lockstep build/lockstep_tests .devcall/stage/tile/
  git apply benchmarks/pending/prefill_unmasked_tiles.patch
  cmake --build build -j2 --target lockstep lockstep_tests
  cp build/lockstep build/lockstep_tests .devcall/stage/unmask/
  git checkout -- kernels tests && trap - EXIT
  cmake --build build -j2 --target lockstep lockstep_tests
  bash tools/pack_device_libs.sh && cp .deps/lib/* .devcall/stage/
  strip .devcall/stage/*/lockstep*
  tar cJf .devcall/bin.tar.xz -C .devcall/stage .
  [ -d build/tokenizers ] || bash scripts/fetch_tokenizers.sh build/tokenizers
  tar cJf .devcall/tok.tar.xz -C build tokenizers
  rm -rf .devcall/stage && ls -l .devcall
}
bench_timeline() {  # VARIANT: a --no-pdl prefill timeline, folded by tools/step_timeline.py
  KERNEL_TIMELINE_CSV=$L/tl_$1.csv CUDA_INJECTION64_PATH=/tmp/p/libkernel_timeline.so timeout 100 \
    /tmp/p/$1/lockstep bench --backend cuda --preset llama3-8b --batch 1 --ctx 16 --steps 4 \
    --prefill-runs 3 --no-pdl > $L/tlbench_$1.txt 2>&1
  echo "timeline $1 rc=$? $((SECONDS - t0))s" >> $L/summary.txt
  python3 tools/step_timeline.py --prefill $L/tl_$1.csv > $L/prefill_$1.txt 2>&1
  xz -T4 $L/tl_$1.csv; save
}
bench_decode() {  # VARIANT: decode at batch 1 and 32, and the 2048-token prefill
  timeout 90 /tmp/p/$1/lockstep bench --backend cuda --preset llama3-8b --batch 1,32 --ctx 1024 \
    --steps 128 >> $L/bench_$1.txt 2>&1
  echo "bench $1 rc=$? $((SECONDS - t0))s" >> $L/summary.txt; save
}
gpu_tests() {  # VARIANT FILTER: the tests call build/lockstep, so it is that variant's
  cp /tmp/p/$1/lockstep build/lockstep
  timeout 240 /tmp/p/$1/lockstep_tests --gtest_filter="$2" > $L/tests_$1.txt 2>&1
  echo "$1 tests rc=$? $((SECONDS - t0))s" >> $L/summary.txt
  grep -E "PASSED|FAILED" $L/tests_$1.txt >> $L/summary.txt; save
}
device() {
  L=/tmp/logs; mkdir -p $L /tmp/p build
  save() { tar czf "$OUT/logs.tgz" -C $L .; }
  tar xJf .devcall/bin.tar.xz -C /tmp/p && tar xJf .devcall/tok.tar.xz -C build || exit 1
  mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
  export LD_LIBRARY_PATH=/tmp/p:/usr/local/cuda/lib64:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
  export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export LOCKSTEP_TOKENIZER_DIR=$PWD/build/tokenizers
  { nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; } > $L/gpu.txt 2>&1
  t0=$SECONDS
  for v in head tile; do bench_timeline $v; done
  gpu_tests tile 'Cuda*:*CudaGolden*:GraphReplay*'
  for v in head tile; do bench_decode $v; done
  gpu_tests unmask 'CudaAttention*:*CudaGolden*'
  bench_timeline unmask
  for v in head tile; do bench_decode $v; done
  cat $L/gpu.txt $L/summary.txt
  for v in head tile unmask; do echo "== $v"; grep -iE "attention|rope" $L/prefill_$v.txt | head -8; done
  for v in head tile; do echo "== $v"; grep -iE "tok/s|prefill" $L/bench_$v.txt | tail -8; done
}
case "${1:-}" in
  pack) pack ;;
  device) device ;;
  *) echo "usage: $0 pack|device"; exit 2 ;;
esac
