// RMSNorm with the optional fused residual add: one block per row. The sum
// x + residual is rounded to the storage type, written to residual_out and
// normalized from that rounded value (as the Hugging Face models do); the
// sum of squares and the scaling are float32. residual_out may alias
// residual: each thread reads and writes the same elements.
//
// A thread's first kHeld vectors of the row stay in registers between the
// sum of squares and the scaling (rows up to kHeld·N·1024 elements are read
// once), and their norm weights are loaded before the wait for the producer
// (no kernel writes weights): at decode the kernel is a chain of latencies,
// not of bytes. Few registers matter as much: the block is scheduled early
// (programmatic dependent launch) only if it fits beside the blocks of the
// GEMV before it (measured: 90 registers a thread, kHeld = 4 at 512 threads,
// cost ~0.1 ms a step against 30).
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kHeld = 2;
constexpr int kMaxThreads = 1024;

// The (rounded) input at column c: x, or x + residual written to residual_out.
template <typename T, int N>
__device__ Vec<T, N> norm_input(const T* x, const T* residual, T* residual_out, int64_t c) {
  Vec<T, N> a;
  a.load(x + c);
  if (residual != nullptr) {
    Vec<T, N> r;
    r.load(residual + c);
#pragma unroll
    for (int i = 0; i < N; ++i) a.set(i, a.get(i) + r.get(i));
    a.store(residual_out + c);
  }
  return a;
}

template <typename T, int N>
__device__ void store_scaled(const Vec<T, N>& a, const Vec<T, N>& w, float inv, T* out) {
  Vec<T, N> o;
#pragma unroll
  for (int i = 0; i < N; ++i) o.set(i, a.get(i) * inv * w.get(i));
  o.store(out);
}

// A null weight is all ones (RmsNormParams).
template <typename T, int N>
__device__ Vec<T, N> weight_at(const T* weight, int64_t c) {
  Vec<T, N> w;
  if (weight != nullptr) {
    w.load(weight + c);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) w.set(i, 1.0f);
  }
  return w;
}

template <typename T, int N>
__global__ void __launch_bounds__(kMaxThreads) rms_norm_kernel(const T* x, const T* residual, T* residual_out, const T* weight, T* out, int64_t cols,
                                float eps) {
  using V = Vec<T, N>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * N;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * N;
  V w_held[kHeld];
#pragma unroll
  for (int j = 0; j < kHeld; ++j)
    if (first + j * stride < cols) w_held[j] = weight_at<T, N>(weight, first + j * stride);
  start_after_producers();
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * cols;
  x += offset, out += offset;
  if (residual != nullptr) residual += offset, residual_out += offset;
  V held[kHeld];
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kHeld; ++j)
    if (first + j * stride < cols) {
      held[j] = norm_input<T, N>(x, residual, residual_out, first + j * stride);
#pragma unroll
      for (int i = 0; i < N; ++i) sq += held[j].get(i) * held[j].get(i);
    }
  for (int64_t c = first + kHeld * stride; c < cols; c += stride) {
    const V a = norm_input<T, N>(x, residual, residual_out, c);
#pragma unroll
    for (int i = 0; i < N; ++i) sq += a.get(i) * a.get(i);
  }
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(cols) + eps);
#pragma unroll
  for (int j = 0; j < kHeld; ++j)
    if (first + j * stride < cols) store_scaled(held[j], w_held[j], inv, out + first + j * stride);
  const T* src = residual != nullptr ? residual_out : x;  // the rounded sum this thread wrote
  for (int64_t c = first + kHeld * stride; c < cols; c += stride) {
    V a;
    a.load(src + c);
    store_scaled(a, weight_at<T, N>(weight, c), inv, out + c);
  }
}

template <typename T, int N>
void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  const int threads =
      static_cast<int>(std::clamp<int64_t>((ceil_div(p.cols, N * kHeld) + 31) / 32 * 32, 32, kMaxThreads));
  LS_LAUNCH("rms_norm_kernel", rms_norm_kernel<T, N>, dim3(static_cast<unsigned>(p.rows)), dim3(threads), 0, stream,
            static_cast<const T*>(p.x), static_cast<const T*>(p.residual), static_cast<T*>(p.residual_out),
            static_cast<const T*>(p.weight), static_cast<T*>(p.out), p.cols, p.eps);
}

}  // namespace

void rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  dispatch_dtype(p.dtype, "rms_norm", [&](auto t) {
    using T = decltype(t);
    if (p.cols % kVec16<T> == 0)
      launch_rms_norm<T, kVec16<T>>(p, stream);
    else
      launch_rms_norm<T, 1>(p, stream);
  });
}

}  // namespace lockstep::cuda
