#!/usr/bin/env bash
# Builds lockstep with the CUDA backend on a GPU machine and checks it in one
# go: the op tests, compute-sanitizer memcheck and racecheck on them, and the
# CUDA backend against the CPU backend end to end on a `small` model (greedy
# ids over 64 tokens; teacher-forced logits). Logs go to $OUT; a summary
# table is printed last.
#   tools/gpu_check.sh [DEBS_DIR [STAGE...]]
# DEBS_DIR: .deb files of missing build deps ("" for none). STAGES (default
# all): tests sanitize e2e oracle (tools/oracle_sweep.py) bench_small tp; on request multi_gpu (needs 2+
# GPUs: tensor parallelism over all of them), attention and
# profile_attention (benchmarks/attention_bench), linear
# (benchmarks/linear_bench: the weight stream per layer shape), sample
# (benchmarks/sample_bench: the sample op alone), profile_sample, bench_8b
# (llama3-8b with the PyTorch peers; slow), bench_8b_lockstep, bench_8b_nopdl,
# bench_8b_sample and profile_8b (on the llama3-8b preset). The build runs
# unless NO_BUILD=1 finds one.
set -uo pipefail
OUT=${OUT:-/tmp/lockstep_out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
SRC=$(cd "$(dirname "$0")/.." && pwd)
DEBS=${1:-}
shift || true
STAGES=${*:-tests sanitize e2e oracle bench_small tp}  # also: linear sample profile_sample bench_8b bench_8b_lockstep bench_8b_nopdl bench_8b_sample profile_8b
declare -a SUMMARY
want() { [[ " $STAGES " == *" $1 "* ]]; }

# The summary also goes to summary.txt as it grows, so that a run cut off by
# a time limit still reports its finished stages.
note() { SUMMARY+=("[${SECONDS}s] $1"); echo "== [${SECONDS}s] $1"; echo "[${SECONDS}s] $1" >> "$OUT/summary.txt"; }

dpkg -l | grep -E "spdlog|gtest|googletest|cli11|pcre2|utf8proc|nlohmann|openmpi" | awk '{print $2, $3}' > "$OUT/dpkg.txt"
nvidia-smi -L | tee "$OUT/gpu.txt"
CMAKE_EXTRA=()
if [ -n "$DEBS" ] && [ -d "$DEBS" ]; then
  [ -d /tmp/sysroot ] || for f in "$DEBS"/*.deb; do dpkg -x "$f" /tmp/sysroot; done
  export PKG_CONFIG_LIBDIR=/tmp/sysroot/usr/lib/x86_64-linux-gnu/pkgconfig
  export PKG_CONFIG_SYSROOT_DIR=/tmp/sysroot
  export LD_LIBRARY_PATH=/tmp/sysroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  CMAKE_EXTRA+=(-DCMAKE_PREFIX_PATH=/tmp/sysroot/usr)
fi

BUILD=/tmp/lockstep_build
# NO_BUILD=1: use the build an earlier invocation made (invocations running
# side by side must not configure the same build directory at once).
if [ "${NO_BUILD:-0}" = 1 ] && [ -x "$BUILD/lockstep_tests" ]; then
  note "build reused"
else
  cmake -S "$SRC" -B "$BUILD" -DLOCKSTEP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a "${CMAKE_EXTRA[@]}" \
    > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; note "cmake FAILED"; }
  if make -C "$BUILD" -j16 > "$OUT/build.log" 2>&1; then
    note "build ok"
  else
    grep -E "error" "$OUT/build.log" | head -30
    echo "== build FAILED"
    exit 1
  fi
fi
T="$BUILD/lockstep_tests"
L="$BUILD/lockstep"

if want tests; then
  # TESTS_FILTER: e.g. 'Cuda*:GpuTp*' for the GPU tests alone (the CPU tests take minutes and run in CI).
  "$T" --gtest_brief=1 --gtest_filter="${TESTS_FILTER:-*}" > "$OUT/tests.log" 2>&1
  note "all tests rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/tests.log" | tr '\n' ' ')"
  grep -E "Failure|error:|Expected|worst" "$OUT/tests.log" | head -40
fi

# sanitize: compute-sanitizer memcheck and racecheck over the GPU op tests,
# one process per (tool, test), SANITIZE_JOBS at a time (default: the host's
# cores; 50 at once on 16 cores left 10 racecheck runs past 240 s on
# 2026-12-04; three of them, run alone, finished clean in one 144 s call
# with its build), each under
# SANITIZER_TIMEOUT_S. Racecheck skips LinearMatchesCpu,
# LinearStagesMatchCpu and LinearFoldedNormAndResidualMatchCpu: their
# products of 3 or more rows are cuBLASLt's kernels, in which racecheck
# reports hazards (12 in nvjet_sm90_*_splitK kernels at 7 and 19 rows,
# 2026-12-03; 28 in nvjet kernels of the folded-norm test, 2026-12-06; none
# in ours, the scaled SiLU·mul kernel included). Our kernels of those tests
# are racechecked elsewhere: rms_norm in RmsNormMatchesCpu, the GEMV's
# shared memory (the RoPE epilogue) in LinearRopeStageMatchesCpu, whose
# cuBLASLt shapes reported none. SANITIZE_FILTER narrows the tests (e.g. the
# kernels a change touched).
sanitize_one() {  # TOOL TEST
  timeout "$SANITIZER_TIMEOUT_S" compute-sanitizer --tool "$1" --error-exitcode 9 "$T" --gtest_brief=1 \
    --gtest_filter="$2" > "$OUT/sanitize/$1.$2.log" 2>&1
  echo "$1 $2 rc=$?" >> "$OUT/sanitize/rc.txt"
}
if want sanitize; then
  mkdir -p "$OUT/sanitize"
  "$T" --gtest_list_tests --gtest_filter="${SANITIZE_FILTER:-CudaOpTest*:CudaAttentionTest*}" |
    awk '/^[^ ]/{suite=$1} /^  /{print suite $1}' > "$OUT/sanitize/tests.txt"
  export -f sanitize_one
  export T OUT SANITIZER_TIMEOUT_S=${SANITIZER_TIMEOUT_S:-200}
  TOOLS=${SANITIZE_TOOLS:-memcheck racecheck}  # also synccheck (barriers and warp-synchronous intrinsics)
  for tool in $TOOLS; do
    if [ "$tool" = racecheck ]; then grep -v -x -e 'CudaOpTest.LinearMatchesCpu' -e 'CudaOpTest.LinearStagesMatchCpu' \
      -e 'CudaOpTest.LinearFoldedNormAndResidualMatchCpu' "$OUT/sanitize/tests.txt"
    else cat "$OUT/sanitize/tests.txt"; fi | sed "s/^/$tool /"
  done | xargs -P "${SANITIZE_JOBS:-$(nproc)}" -L 1 bash -c 'sanitize_one "$@"' _
  for tool in $TOOLS; do
    runs=$(grep -c "^$tool " "$OUT/sanitize/rc.txt")
    clean=$(grep -l -E "(ERROR|RACECHECK) SUMMARY: 0 (errors|hazards)" "$OUT"/sanitize/$tool.*.log 2>/dev/null | wc -l)
    note "$tool: $clean of $runs tests reached a clean summary; not clean: $(grep "^$tool " "$OUT/sanitize/rc.txt" |
      grep -v 'rc=0' | tr '\n' ' ')"
    grep -h -E "^========= (Error|Warning|Race|Invalid)|^=========     in |SUMMARY|FAILED" "$OUT"/sanitize/$tool.*.log |
      grep -v -E "SUMMARY: 0 (errors|hazards)" | sed 's/0x[0-9a-f]*//g' | sort | uniq -c | sort -rn | head -12
  done
fi

M=/tmp/small_model
if want e2e; then
"$L" make-model --preset small --out "$M" > "$OUT/make_model.log" 2>&1 || note "make-model FAILED"
PROMPT=1,20,300,4000,5,60,700,8000
for cfg in "cpu auto" "cuda auto" "cuda float32" "cuda auto --eager" "cuda auto --sync-steps"; do
  set -- $cfg
  name=$1_$2${3:+_${3#--}}
  "$L" generate --model "$M" --backend "$1" --dtype "$2" ${3:-} --max-seq-len 256 --prompt-ids $PROMPT \
    --max-new-tokens 64 --stop-ids 0 > "$OUT/gen_$name.txt" 2> "$OUT/gen_$name.log"
  note "generate $name rc=$? $(grep -o 'loaded in .*' "$OUT/gen_$name.log")"
done
# Sampled (temperature 0.8, top-p 0.9, seed 7): the sample op on the GPU against the CPU twin.
for backend in cpu cuda; do
  "$L" generate --model "$M" --backend $backend --dtype float32 --max-seq-len 256 --prompt-ids $PROMPT \
    --max-new-tokens 64 --stop-ids 0 --temperature 0.8 --top-p 0.9 --seed 7 \
    > "$OUT/gen_sampled_$backend.txt" 2> "$OUT/gen_sampled_$backend.log"
  note "generate sampled $backend rc=$?"
done
python3 - "$OUT" <<'PY'
import sys
out = sys.argv[1]
ref = open(f"{out}/gen_cpu_auto.txt").read().split()
for name in ("cuda_auto", "cuda_float32", "cuda_auto_eager"):
    got = open(f"{out}/gen_{name}.txt").read().split()
    same = 0
    for a, b in zip(ref, got):
        if a != b: break
        same += 1
    print(f"== greedy {name} vs cpu: first {same} of {len(ref)} ids agree")
ref = open(f"{out}/gen_sampled_cpu.txt").read().split()
got = open(f"{out}/gen_sampled_cuda.txt").read().split()
same = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
print(f"== sampled float32 cuda vs cpu: first {same} of {len(ref)} ids agree")
eager = open(f"{out}/gen_cuda_auto_eager.txt").read().split()
graphed = open(f"{out}/gen_cuda_auto.txt").read().split()
print(f"== greedy cuda graphed vs eager: {'identical' if eager == graphed else 'DIFFERENT'} ({len(graphed)} ids)")
synced = open(f"{out}/gen_cuda_auto_sync-steps.txt").read().split()
print(f"== greedy cuda queued vs --sync-steps: {'identical' if synced == graphed else 'DIFFERENT'} ({len(graphed)} ids)")
PY
SCORE=$(python3 -c "import random; random.seed(3); print(','.join(str(random.randrange(16384)) for _ in range(200)))")
for cfg in "cpu auto" "cuda auto" "cuda float32"; do
  set -- $cfg
  "$L" score --model "$M" --backend "$1" --dtype "$2" --max-seq-len 256 --prompt-ids "$SCORE" \
    --dump-logits "$OUT/score_$1_$2.npy" > "$OUT/score_$1_$2.log" 2>&1 || note "score $1/$2 FAILED"
done
python3 - "$OUT" <<'PY'
import sys, numpy as np
out = sys.argv[1]
ref = np.load(f"{out}/score_cpu_auto.npy").astype(np.float64)
for name in ("cuda_auto", "cuda_float32"):
    got = np.load(f"{out}/score_{name}.npy").astype(np.float64)
    err = np.abs(got - ref)
    print(f"== score {name} vs cpu: max|err| {err.max():.4g}, rms err {np.sqrt((err**2).mean()):.4g}, "
          f"logit std {ref.std():.4g}, max/std {err.max()/ref.std():.4g}, "
          f"argmax agree {(got.argmax(1) == ref.argmax(1)).mean()*100:.1f}%")
PY
fi

# oracle: lockstep against transformers (float64) on random-weight models in
# the shapes of published checkpoints (tools/oracle_sweep.py; ORACLE_ONLY
# takes a comma-separated subset of its cases, ORACLE_TP the tensor-parallel
# sizes, default 2,4, ranks sharing this GPU).
if want oracle; then
  PYTHONUNBUFFERED=1 timeout ${ORACLE_TIMEOUT_S:-420} python3 "$SRC/tools/oracle_sweep.py" --lockstep "$L" \
    --out /tmp/oracle_sweep --only "${ORACLE_ONLY:-}" --tp "${ORACLE_TP-2,4}" > "$OUT/oracle.txt" 2>&1
  note "oracle sweep rc=$? $(tail -1 "$OUT/oracle.txt")"
  grep -E "^!! |== built" "$OUT/oracle.txt" | head -20
fi

# tp: the NCCL and host-staged transports on this GPU (the GpuTp tests also
# run in `tests`), and all-reduce latency/bandwidth at 1 and 2 ranks.
if want tp; then
  "$T" --gtest_filter='GpuTp*' > "$OUT/tp_tests.log" 2>&1
  note "GPU TP tests rc=$? $(grep -E 'max \|diff\||PASSED|FAILED' "$OUT/tp_tests.log" | tr '\n' ' ')"
  "$BUILD/allreduce_bench" 100 > "$OUT/allreduce_1rank.txt" 2>&1
  note "allreduce_bench 1 rank rc=$?"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 "$BUILD/allreduce_bench" 50 \
    > "$OUT/allreduce_2ranks.txt" 2>&1
  note "allreduce_bench 2 ranks, one GPU rc=$?"
fi

# multi_gpu: tensor parallelism over this machine's GPUs (2 or more): the
# MultiGpu tests (TP=N against TP=1 in 4 shards side by side, then the
# fault tests alone), all-reduce at N ranks (NCCL eager and graphed), and
# bench on random weights generated in memory: the llama3-8b preset at TP=1
# and TP=N, the llama3-70b preset at TP=N (MULTI_BENCH_BATCH, default 1,32).
# MULTI_FILTER narrows the parity tests; MULTI_BENCH_RUNS ("model ranks" pairs
# separated by ';', e.g. "8b 2") picks the benches, "" none.
if want multi_gpu; then
  NGPU=$(nvidia-smi -L | wc -l)
  ranks() {  # SECONDS N COMMAND...: COMMAND at N ranks (N = 1: alone), for at most SECONDS
    local limit=$1 n=$2; shift 2
    if [ "$n" = 1 ]; then timeout "$limit" "$@"; else
      timeout "$limit" env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --bind-to none \
        -x NCCL_NVLS_ENABLE=0 -np "$n" "$@"
    fi
  }
  # One TP=N generation timed on its own first: start-up, NCCL set-up and exit.
  "$L" make-model --preset small --out "$M" > "$OUT/make_model.log" 2>&1
  start=$SECONDS
  ranks 120 "$NGPU" "$L" --log-level debug generate --backend cuda --comm nccl --model "$M" --prompt-ids 1,2,3 \
    --max-new-tokens 32 --ignore-eos > "$OUT/multi_generate.txt" 2> "$OUT/multi_generate.log"
  note "TP=$NGPU generate of small rc=$? in $((SECONDS - start)) s; last log line: $(tail -1 "$OUT/multi_generate.log")"
  for i in 0 1 2 3; do
    GTEST_TOTAL_SHARDS=4 GTEST_SHARD_INDEX=$i "$T" --gtest_filter="${MULTI_FILTER:-MultiGpuGolden*:MultiGpu/*}" \
      > "$OUT/multi_tests_$i.log" 2>&1 &
  done
  wait
  note "multi-GPU parity tests ($NGPU GPUs): $(cat "$OUT"/multi_tests_*.log | grep -E '^\[  (PASSED|FAILED|SKIPPED)' |
    awk '{n[$2]+=$3} END {for (k in n) printf "%s %d ", k, n[k]}')"
  grep -h -E "^TP=|Failure|Expected|Which is" "$OUT"/multi_tests_*.log | sort | uniq -c | sort -rn | head -30
  "$T" --gtest_brief=1 --gtest_filter='MultiGpuFaults*' > "$OUT/multi_faults.log" 2>&1
  note "multi-GPU fault tests rc=$? $(grep -E '^job ended|PASSED|FAILED' "$OUT/multi_faults.log" | tr '\n' ' ')"
  ranks 120 "$NGPU" "$BUILD/allreduce_bench" 50 > "$OUT/allreduce_${NGPU}ranks.txt" 2>&1
  note "allreduce_bench $NGPU ranks rc=$? (table in allreduce_${NGPU}ranks.txt)"
  grep -E "nccl" "$OUT/allreduce_${NGPU}ranks.txt" | head -40
  BENCH=(bench --batch "${MULTI_BENCH_BATCH:-1,32}" --ctx 1024 --steps 64)
  RUNS=("8b 1" "8b $NGPU" "70b $NGPU")
  [ -n "${MULTI_BENCH_RUNS+set}" ] && IFS=';' read -ra RUNS <<< "$MULTI_BENCH_RUNS"
  for run in "${RUNS[@]}"; do
    set -- $run
    ranks 300 "$2" "$L" "${BENCH[@]}" --preset "llama3-$1" --json "$OUT/bench_$1_tp$2.json" \
      > "$OUT/bench_$1_tp$2.txt" 2> "$OUT/bench_$1_tp$2.log"
    note "bench llama3-$1 TP=$2 rc=$? $(grep -E '^(copy|prefill|[0-9]+ )' "$OUT/bench_$1_tp$2.txt" | tr -s ' ' | tr '\n' ';')"
  done
fi

if want bench_small; then
"$L" make-model --preset small --out "$M" > "$OUT/make_model.log" 2>&1
"$L" bench --model "$M" --batch 1,8 --ctx 128 --steps 32 --prefill 256 > "$OUT/bench_small.txt" 2> "$OUT/bench_small.log"
note "bench small rc=$? $(tr '\n' ' ' < "$OUT/bench_small.txt")"
fi

# attention: benchmarks/attention_bench (decode attention alone, split caps);
# profile_attention: ncu's full set on one launch of each row in
# PROFILE_ATTENTION ("batch cap" pairs separated by ';', default the split
# rule at batch 1 and 32).
if want attention; then
  "$BUILD/attention_bench" 20 1024 > "$OUT/attention_bench.txt" 2>&1
  note "attention_bench rc=$? (table in attention_bench.txt)"
  cat "$OUT/attention_bench.txt"
fi
if want profile_attention; then
  IFS=';' read -ra PROWS <<< "${PROFILE_ATTENTION:-1 0;32 0}"
  for row in "${PROWS[@]}"; do
    tag=$(echo $row | tr ' ' _)
    timeout ${PROFILE_TIMEOUT_S:-120} ncu --set full -k regex:attention --launch-skip 40 --launch-count 1 \
      -o "$OUT/attn_$tag" "$BUILD/attention_bench" 2 1024 $row > "$OUT/profile_attention_$tag.log" 2>&1
    ncu --import "$OUT/attn_$tag.ncu-rep" --print-details all > "$OUT/profile_attention_$tag.txt" 2>&1
    note "profile attention $row rc=$? $(grep -E '^    (Duration|DRAM Throughput|Achieved Occupancy|Registers Per)' \
      "$OUT/profile_attention_$tag.txt" | awk '!seen[$1]++ {print $1, $(NF)}' | tr '\n' ' ')"
  done
fi
if want linear; then
  "$BUILD/linear_bench" 50 > "$OUT/linear_bench.txt" 2>&1
  note "linear_bench rc=$? (table in linear_bench.txt)"
fi

# sample: the sample op alone (benchmarks/sample_bench), flat and peaked logits, 1-64 rows.
if want sample; then
  "$BUILD/sample_bench" 20 > "$OUT/sample_bench.txt" 2>&1
  note "sample_bench rc=$? $(awk '$3 == 1 || $3 == 32 {printf "%s/%s/%s:%s ", $1, $2, $3, $4}' "$OUT/sample_bench.txt")"
fi

# profile_sample: ncu's full set with source lines on one sample op launch
# (PROFILE_SAMPLE: "shape setting rows" of sample_bench, default "flat
# t0.7,p0.9 1"): the sections, then the hottest source lines by warp stalls.
if want profile_sample; then
  timeout ${PROFILE_TIMEOUT_S:-200} ncu --set full --import-source yes -k regex:sample_kernel --launch-count 1 \
    -o "$OUT/sample" "$BUILD/sample_bench" 1 ${PROFILE_SAMPLE:-flat t0.7,p0.9 1} > "$OUT/profile_sample.log" 2>&1
  note "profile sample rc=$?"
  ncu --import "$OUT/sample.ncu-rep" --print-details all > "$OUT/profile_sample.txt" 2>&1
  ncu --import "$OUT/sample.ncu-rep" --page source --print-source cuda --csv > "$OUT/profile_sample_source.csv" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp|Achieved Occupancy|Stall|Registers" "$OUT/profile_sample.txt" | head -30
fi

if want bench_8b_lockstep; then
  STEPS=64 bash "$SRC/benchmarks/run_bench.sh" "$L" "$OUT" --no-peer
  note "bench 8b (lockstep only) rc=$? after ${SECONDS}s"
fi

# The same model at batch 1 and 32 without launch overlap (--no-pdl), to
# tell its share of the step time.
if want bench_8b_nopdl; then
  "$L" bench --preset llama3-8b --batch 1,32 --ctx 1024 --steps 64 --no-pdl \
    > "$OUT/bench_8b_nopdl.txt" 2> "$OUT/bench_8b_nopdl.log"
  note "bench 8b --no-pdl rc=$? $(grep -E '^(1|32) ' "$OUT/bench_8b_nopdl.txt" | tr '\n' ' ')"
fi

# bench_8b_sample: the same at batch 1 and 32 with sampled decoding (the sample op instead of argmax).
if want bench_8b_sample; then
  "$L" bench --preset llama3-8b --batch 1,32 --ctx 1024 --steps 64 --temperature 0.7 --top-p 0.9 \
    > "$OUT/bench_8b_sample.txt" 2> "$OUT/bench_8b_sample.log"
  note "bench 8b sampled rc=$? $(grep -E '^(1|32) ' "$OUT/bench_8b_sample.txt" | tr '\n' ' ')"
fi

# profile_8b: every kernel's duration (ncu) in one eager decode step of
# llama3-8b at batch PROFILE_BATCH (default 1), summed by kernel. With PROFILE_LAYER=N only layer
# N's kernels are profiled (an NVTX range; much faster at large batches,
# whose context fill is thousands of kernels) and one decode period of it is
# summed.
if want profile_8b; then
  NVTX=(); PERIOD=()
  [ -n "${PROFILE_LAYER:-}" ] && { NVTX=(--nvtx --nvtx-include "layer ${PROFILE_LAYER}/"); PERIOD=(--layer); }
  timeout ${PROFILE_TIMEOUT_S:-150} ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    "${NVTX[@]}" "$L" bench --preset llama3-8b --batch ${PROFILE_BATCH:-1} --ctx 1024 --steps 4 \
    --prefill 64 --eager > "$OUT/profile_8b.csv" 2> "$OUT/profile_8b.log"
  note "profile 8b rc=$?"
  python3 "$SRC/tools/kernel_times.py" "${PERIOD[@]}" "$OUT/profile_8b.csv" | tee "$OUT/profile_8b.txt"
fi

if want bench_8b; then
  bash "$SRC/benchmarks/run_bench.sh" "$L" "$OUT"
  note "bench 8b rc=$? after ${SECONDS}s"
fi
# The device tool returns few files: everything but the summary goes in one archive.
tar czf /tmp/lockstep_logs.tgz -C "$OUT" --exclude='*.npy' --exclude=summary.txt . &&
  find "$OUT" -type f ! -name summary.txt -delete && mv /tmp/lockstep_logs.tgz "$OUT/logs.tgz"
echo "---- summary"
printf '%s\n' "${SUMMARY[@]}"
