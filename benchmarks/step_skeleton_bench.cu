// The memory skeleton of a decode step: how long a llama3-8b step at a given
// batch and context would take if every op did nothing but read its bytes
// from DRAM, under four ways of putting the step's phases in sequence. It
// bounds what any design of the step's kernels can reach (the question behind
// issue #4's batch-32 target; benchmarks/NOTES.md).
//
// A layer reads five segments in order: the QKV weights, the KV cache
// (batch x ctx positions of K and V), the o_proj, gate_up and down weights;
// the LM head's weights end the step. Every warp reads rounds of 8 KB (16
// loads of 16 bytes a lane, 2 rows x 4 KB as weight_stream_bench's best
// patterns) and folds them into a checksum, 16 warps an SM (128 KB of loads
// in flight, weight_stream_bench's full rate). The modes:
//   stream    one persistent kernel reads the whole step with no ordering
//             between segments: the bytes at the rate the loads reach.
//   barrier   the same kernel with a grid-wide barrier after each segment,
//             as a persistent whole-step kernel must wait for an op's
//             outputs before the next op reads them.
//   prefetch  the barrier, but each warp issues its first round of the next
//             segment before it waits (weights and past keys do not depend
//             on the outputs being waited for).
//   kernels   one kernel per segment (161 a step at 32 layers) in a CUDA
//             graph, each starting when the one before has ended: the
//             step as separate ops that cannot launch early (cuBLASLt's).
//   pdl       the same kernels as programmatic dependents: each issues its
//             first round before griddepcontrol.wait and lets the next
//             launch after its wait (the project's own kernels' scheme).
//   pdl-late  the same, but a warp lets the next launch only as it issues
//             its last round (the next kernel's blocks then take the SMs
//             as this one's leave, not while it still streams).
// Prints ms a step, % of the copy bandwidth over the step's bytes, and the
// decode tok/s the step time would give at the batch.
// Run: build/step_skeleton_bench [batch ctx]   (default 32 1024)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"

namespace {

using lockstep::bench::load_streaming;
using lockstep::cuda::ceil_div;

constexpr int kWarps = 4;             // a block
constexpr int kBlocksPerSm = 4;       // 16 warps an SM
constexpr int64_t kUnitBytes = 8192;  // a warp's round
constexpr int kLoads = 16;

// llama3-8b (bf16).
struct StepShape {
  int64_t hidden = 4096, inter = 14336, heads = 32, kv_heads = 8, head_dim = 128, vocab = 128256, layers = 32;
  int64_t batch = 32, ctx = 1024;
};

struct Segments {
  std::vector<int64_t> offset, units;  // in units of 8 KB
  int64_t total_units = 0;
  void add(int64_t bytes) {
    offset.push_back(total_units);
    units.push_back(2 * ceil_div(bytes, 2 * kUnitBytes));  // whole pairs of rows (load_unit)
    total_units += units.back();
  }
};

Segments step_segments(const StepShape& s) {
  Segments seg;
  for (int64_t l = 0; l < s.layers; ++l) {
    seg.add(s.hidden * (s.heads + 2 * s.kv_heads) * s.head_dim * 2);  // qkv
    seg.add(s.batch * s.ctx * s.kv_heads * s.head_dim * 2 * 2);      // K and V
    seg.add(s.heads * s.head_dim * s.hidden * 2);                     // o_proj
    seg.add(s.hidden * 2 * s.inter * 2);                              // gate_up
    seg.add(s.inter * s.hidden * 2);                                  // down
  }
  seg.add(s.vocab * s.hidden * 2);  // LM head
  return seg;
}

// Unit u of a segment as 2 rows x 4 KB (rows 8 KB apart, a pair of rows a unit pair).
__device__ __forceinline__ void load_unit(const unsigned char* seg, int64_t u, int lane, uint4 (&v)[kLoads]) {
  const unsigned char* base = seg + (u / 2) * 2 * kUnitBytes + (u % 2) * 4096;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) v[i] = load_streaming(base + (i / 8) * kUnitBytes + (i % 8) * 512 + lane * 16);
}

__device__ __forceinline__ unsigned fold(const uint4 (&v)[kLoads]) {
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  return acc;
}

// Keeps the compiler from folding registers loaded before a barrier ahead of it.
__device__ __forceinline__ void pin(uint4 (&v)[kLoads]) {
#pragma unroll
  for (int i = 0; i < kLoads; ++i) asm volatile("" : "+r"(v[i].x), "+r"(v[i].y), "+r"(v[i].z), "+r"(v[i].w));
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A grid-wide barrier over co-resident blocks (cooperative launch):
// counter[0] counts arrivals, counter[1] is the generation.
__device__ void grid_barrier(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned generation = load_acquire(counter + 1);
    __threadfence();
    if (atomicAdd(counter, 1u) == gridDim.x - 1) {
      counter[0] = 0;
      __threadfence();
      atomicAdd(counter + 1, 1u);
    } else {
      while (load_acquire(counter + 1) == generation) {
      }
    }
  }
  __syncthreads();
}

struct StepArgs {
  const unsigned char* base;
  const int64_t* offset;  // device arrays, units
  const int64_t* units;
  int segments;
  unsigned* counter;
  unsigned* sink;
};

template <bool Barrier, bool Prefetch>
__global__ void __launch_bounds__(kWarps * 32) persistent_step(StepArgs a) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  unsigned acc = 0;
  uint4 v[kLoads];
  bool have = false;  // v holds unit `warp` of the segment about to start
  for (int s = 0; s < a.segments; ++s) {
    const unsigned char* seg = a.base + a.offset[s] * kUnitBytes;
    int64_t u = warp;
    if (have) {
      pin(v);
      acc ^= fold(v);
      u += warps;
      have = false;
    }
    for (; u < a.units[s]; u += warps) {
      load_unit(seg, u, lane, v);
      acc ^= fold(v);
    }
    if (s + 1 == a.segments) break;
    if constexpr (Prefetch) {
      if (warp < a.units[s + 1]) {
        load_unit(a.base + a.offset[s + 1] * kUnitBytes, warp, lane, v);
        have = true;
      }
    }
    if constexpr (Barrier) grid_barrier(a.counter);
  }
  if (acc == 0x9e3779b9u) a.sink[0] = acc;  // never, in practice: keeps the loads
}

// One segment as its own kernel; as a programmatic dependent it loads its
// first round before waiting for the kernel before it, and lets the next
// kernel launch right after its wait (EarlyTrigger, the project's kernels'
// scheme) or once it has issued its last loads.
template <bool EarlyTrigger>
__global__ void __launch_bounds__(kWarps * 32) segment_kernel(const unsigned char* seg, int64_t units, unsigned* sink) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  uint4 v[kLoads];
  unsigned acc = 0;
  int64_t u = warp;
  if (u < units) load_unit(seg, u, lane, v);
  lockstep::cuda::wait_for_producers();
  if constexpr (EarlyTrigger) lockstep::cuda::allow_consumers_launch();
  if (u < units) {
    pin(v);
    acc ^= fold(v);
  }
  for (u += warps; u < units; u += warps) {
    if (!EarlyTrigger && u + warps >= units) lockstep::cuda::allow_consumers_launch();
    load_unit(seg, u, lane, v);
    acc ^= fold(v);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

struct Bench {
  Segments seg;
  unsigned char* base = nullptr;
  int64_t* d_offset = nullptr;
  int64_t* d_units = nullptr;
  unsigned* counter = nullptr;
  unsigned* sink = nullptr;
  int grid = 0;
  cudaStream_t stream{};
};

template <bool Barrier, bool Prefetch>
double persistent_ms(const Bench& b, int steps) {
  StepArgs args{b.base, b.d_offset, b.d_units, static_cast<int>(b.seg.units.size()), b.counter, b.sink};
  void* params[] = {&args};
  const auto launch = [&] {
    LS_CHECK_CUDA(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(&persistent_step<Barrier, Prefetch>),
                                              dim3(b.grid), dim3(kWarps * 32), params, 0, b.stream));
  };
  launch();
  LS_CHECK_CUDA(cudaStreamSynchronize(b.stream));
  return lockstep::bench::event_ms(b.stream, [&] {
           for (int i = 0; i < steps; ++i) launch();
         }) /
         steps;
}

double kernels_ms(Bench& b, bool pdl, bool early_trigger, int steps) {
  lockstep::cuda::set_overlapped_launches(pdl);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LS_CHECK_CUDA(cudaStreamBeginCapture(b.stream, cudaStreamCaptureModeThreadLocal));
  for (size_t s = 0; s < b.seg.units.size(); ++s)
    LS_LAUNCH("segment", early_trigger ? segment_kernel<true> : segment_kernel<false>, dim3(b.grid), dim3(kWarps * 32), 0, b.stream,
              b.base + b.seg.offset[s] * kUnitBytes, b.seg.units[s], b.sink);
  LS_CHECK_CUDA(cudaStreamEndCapture(b.stream, &graph));
  LS_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  LS_CHECK_CUDA(cudaGraphLaunch(exec, b.stream));
  LS_CHECK_CUDA(cudaStreamSynchronize(b.stream));
  const double ms = lockstep::bench::event_ms(b.stream, [&] {
    for (int i = 0; i < steps; ++i) LS_CHECK_CUDA(cudaGraphLaunch(exec, b.stream));
  });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  lockstep::cuda::set_overlapped_launches(true);
  return ms / steps;
}

}  // namespace

int main(int argc, char** argv) {
  StepShape shape;
  if (argc == 3) {
    shape.batch = std::atoll(argv[1]);
    shape.ctx = std::atoll(argv[2]);
  }
  if ((argc != 1 && argc != 3) || shape.batch <= 0 || shape.ctx <= 0) {
    std::fprintf(stderr, "usage: step_skeleton_bench [batch ctx] (positive; default 32 1024)\n");
    return 2;
  }
  Bench b;
  b.seg = step_segments(shape);
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking));
  int device = 0, sms = 0, resident = 0;
  LS_CHECK_CUDA(cudaGetDevice(&device));
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  LS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, persistent_step<true, true>, kWarps * 32, 0));
  if (resident < kBlocksPerSm) {
    std::fprintf(stderr, "only %d blocks an SM fit, %d needed\n", resident, kBlocksPerSm);
    return 1;
  }
  b.grid = sms * kBlocksPerSm;
  const int64_t bytes = b.seg.total_units * kUnitBytes;
  LS_CHECK_CUDA(cudaMalloc(&b.base, static_cast<size_t>(bytes)));
  LS_CHECK_CUDA(cudaMemsetAsync(b.base, 0x3c, static_cast<size_t>(bytes), b.stream));
  const size_t n = b.seg.units.size();
  LS_CHECK_CUDA(cudaMalloc(&b.d_offset, n * sizeof(int64_t)));
  LS_CHECK_CUDA(cudaMalloc(&b.d_units, n * sizeof(int64_t)));
  LS_CHECK_CUDA(cudaMemcpy(b.d_offset, b.seg.offset.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  LS_CHECK_CUDA(cudaMemcpy(b.d_units, b.seg.units.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  LS_CHECK_CUDA(cudaMalloc(&b.counter, 2 * sizeof(unsigned)));
  LS_CHECK_CUDA(cudaMemset(b.counter, 0, 2 * sizeof(unsigned)));
  LS_CHECK_CUDA(cudaMalloc(&b.sink, sizeof(unsigned)));
  const double copy = lockstep::bench::copy_gbs(b.stream);
  const double floor_ms = static_cast<double>(bytes) / (copy * 1e6);
  std::printf("llama3-8b step skeleton, batch %lld, ctx %lld: %.2f GB in %zu segments; copy bandwidth %.0f GB/s, "
              "%.3f ms at it\n",
              static_cast<long long>(shape.batch), static_cast<long long>(shape.ctx), bytes / 1e9, n, copy, floor_ms);
  std::printf("mode      ms/step  %%copy   tok/s\n");
  const int steps = 20;
  const auto report = [&](const char* mode, double ms) {
    std::printf("%-9s %7.3f  %5.1f  %7.1f\n", mode, ms, 100.0 * floor_ms / ms, shape.batch * 1000.0 / ms);
  };
  for (int round = 0; round < 2; ++round) {  // twice: the spread between rounds is the noise
    report("stream", persistent_ms<false, false>(b, steps));
    report("barrier", persistent_ms<true, false>(b, steps));
    report("prefetch", persistent_ms<true, true>(b, steps));
    report("kernels", kernels_ms(b, false, true, steps));
    report("pdl", kernels_ms(b, true, true, steps));
    report("pdl-late", kernels_ms(b, true, false, steps));
  }
  cudaFree(b.base);
  cudaFree(b.d_offset);
  cudaFree(b.d_units);
  cudaFree(b.counter);
  cudaFree(b.sink);
  return 0;
}
