// What the kernel benchmarks share: event timing on a stream, the mean time
// of a body replayed inside one CUDA graph (as the decode step runs its
// kernels), the copy bandwidth they compare against, bf16 uploads and
// downloads, and random bf16 values filled on the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "kernels/cuda/check.h"

namespace lockstep::bench {

// Milliseconds between events recorded before and after `body()` on `stream`.
template <typename Body>
double event_ms(cudaStream_t stream, Body body) {
  cudaEvent_t start, stop;
  LS_CHECK_CUDA(cudaEventCreate(&start));
  LS_CHECK_CUDA(cudaEventCreate(&stop));
  LS_CHECK_CUDA(cudaEventRecord(start, stream));
  body();
  LS_CHECK_CUDA(cudaEventRecord(stop, stream));
  LS_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0.0f;
  LS_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// Mean time of `body(i)` in microseconds: calls i = 0 .. per_graph-1
// captured in one graph, replayed `iters` times after a warm-up replay.
template <typename Body>
double graphed_us(cudaStream_t stream, int per_graph, int iters, Body body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LS_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) body(i);
  LS_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  LS_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  LS_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  const double ms = event_ms(stream, [&] {
    for (int i = 0; i < iters; ++i) LS_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / (static_cast<double>(iters) * per_graph);
}

// Device-to-device copy of 2 GiB, GB/s counting bytes read and written
// (eager: a 2 GiB copy captured in a graph measured 2.7 TB/s on the H200
// against 4.2 eager).
inline double copy_gbs(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 31;
  void *a = nullptr, *b = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&a, bytes));
  LS_CHECK_CUDA(cudaMalloc(&b, bytes));
  LS_CHECK_CUDA(cudaMemsetAsync(a, 1, bytes, stream));
  LS_CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
  const double us = 1000.0 *
                    event_ms(stream, [&] {
                      for (int i = 0; i < 10; ++i)
                        LS_CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream));
                    }) /
                    10.0;
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / us / 1e3;
}

// A device copy of `bytes` bytes at `host` (cudaFree it).
inline void* upload_bytes(const void* host, size_t bytes) {
  void* d = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&d, bytes));
  LS_CHECK_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

// `count` bf16 values at device address d, as float32.
inline std::vector<float> download_bf16(const void* d, int64_t count) {
  std::vector<uint16_t> raw(static_cast<size_t>(count));
  LS_CHECK_CUDA(cudaMemcpy(raw.data(), d, raw.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  convert_to_f32(raw.data(), DType::kBF16, out.data(), out.size());
  return out;
}

// A device copy of `host` rounded to bf16 (cudaFree it).
inline void* upload_bf16(const std::vector<float>& host) {
  std::vector<uint16_t> raw(host.size());
  convert_from_f32(host.data(), raw.data(), DType::kBF16, host.size());
  return upload_bytes(raw.data(), raw.size() * 2);
}

#ifdef __CUDACC__
// splitmix64's finalizer of (i, seed): the benches' random values.
__device__ __forceinline__ uint32_t hash32(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// Uniform values in [-scale, scale), bf16.
static __global__ void fill_random(__nv_bfloat16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = __float2bfloat16((static_cast<float>(hash32(i, seed) >> 8) * 0x1p-23f - 1.0f) * scale);
}

// A 16-byte load past L1 (not kept there): the weight streams of the
// bandwidth benches.
__device__ __forceinline__ uint4 load_streaming(const unsigned char* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}
#endif

}  // namespace lockstep::bench
