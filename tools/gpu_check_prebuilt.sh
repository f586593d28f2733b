#!/usr/bin/env bash
# Runs tools/gpu_check.sh on the GPU machine with the CUDA binaries built on
# the development machine (Debian 12, nvcc for sm_90a into build-cuda/),
# which saves the ~55 s build of a device call. Carry .deps/debs (if any),
# .deps/lib (tools/pack_device_libs.sh fills it) and build-cuda/lockstep,
# lockstep_tests, allreduce_bench. The tests' compiled-in paths name
# /work/main, so that is linked to this tree. If the binaries do not run
# here, gpu_check builds as usual.
#   STAGES="tests tp" TESTS_FILTER=... [CALL_LIMIT=S] tools/gpu_check_prebuilt.sh
# Seen working on nvidia-h200 on 2026-12-04 (Ubuntu 24.04 image).
O=${LOGS:-/tmp/prebuilt_check}; mkdir -p "$O"
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=$PWD/.deps/lib:${LD_LIBRARY_PATH:-}
for d in .deps/debs/*.deb; do dpkg -x "$d" /tmp/sysroot; done
export LD_LIBRARY_PATH=/tmp/sysroot/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
NB=1
if ldd build-cuda/lockstep_tests | grep "not found" || ! build-cuda/lockstep --help > /dev/null 2>&1; then
  NB=0; echo "prebuilt binaries do not run here: building"
else
  rm -rf /tmp/lockstep_build; ln -s "$PWD/build-cuda" /tmp/lockstep_build
fi
NO_BUILD=$NB OUT=$O timeout "${CALL_LIMIT:-500}" bash tools/gpu_check.sh .deps/debs ${STAGES:-multi_gpu} > "$O/console.txt" 2>&1
echo "gpu_check rc=$?"
[ -n "${OUT:-}" ] && tar czf "$OUT/logs.tgz" -C "$O" .
cat "$O/summary.txt"
