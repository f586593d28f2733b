// Device helpers shared by the CUDA ops: conversions between the storage
// types and float32, 16-byte vectors of elements, and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace lockstep::cuda {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// N elements of T loaded or stored as one aligned access of N·sizeof(T) bytes.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
  __device__ __forceinline__ void load(const T* p) { *this = *reinterpret_cast<const Vec*>(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
  __device__ __forceinline__ float get(int i) const { return to_float(v[i]); }
  __device__ __forceinline__ void set(int i, float f) { v[i] = from_float<T>(f); }
};

// 16 bytes of data that no kernel writes while this one runs (weights),
// read around L1 so that it keeps what is reused (the activations).
template <typename T>
__device__ __forceinline__ Vec<T, static_cast<int>(16 / sizeof(T))> load_streaming(const T* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  Vec<T, static_cast<int>(16 / sizeof(T))> v;
  static_assert(sizeof(v) == sizeof(r));
  __builtin_memcpy(&v, &r, sizeof(r));
  return v;
}

// Elements of T in one 16-byte access.
template <typename T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// silu(gate) · up, the one expression every kernel that applies it uses.
__device__ __forceinline__ float silu_mul_value(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. Uses 33 floats of shared memory.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float s = lane < static_cast<int>(blockDim.x / 32) ? partial[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

// A folded RMSNorm's row scale (LinearParams::input_rms): 1 / sqrt(mean(row²)
// + eps) over `cols` elements, summed by the whole block; every thread must
// call it, and every thread gets the result (as rms_norm_kernel computes it).
template <typename T>
__device__ float inverse_rms(const T* row, int64_t cols, float eps) {
  constexpr int N = kVec16<T>;
  float sq = 0.0f;
  if (cols % N == 0 && reinterpret_cast<uintptr_t>(row) % 16 == 0) {
#pragma unroll 4
    for (int64_t c = static_cast<int64_t>(threadIdx.x) * N; c < cols; c += static_cast<int64_t>(blockDim.x) * N) {
      Vec<T, N> v;
      v.load(row + c);
#pragma unroll
      for (int i = 0; i < N; ++i) sq += v.get(i) * v.get(i);
    }
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sq += to_float(row[c]) * to_float(row[c]);
  }
  return rsqrtf(block_sum(sq) / static_cast<float>(cols) + eps);
}

// Programmatic dependent launch (see check.h). wait_for_producers() returns
// once every earlier kernel in the stream has finished and its writes are
// visible; allow_consumers_launch() lets the next kernel be scheduled (called
// after the wait, so that at most two kernels are in flight). Both are no-ops
// for a launch without the overlap.
__device__ __forceinline__ void wait_for_producers() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_consumers_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, for kernels with nothing to do before the wait.
__device__ __forceinline__ void start_after_producers() {
  wait_for_producers();
  allow_consumers_launch();
}

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace lockstep::cuda
