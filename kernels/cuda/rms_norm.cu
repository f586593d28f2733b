// RMSNorm with the optional fused residual add: one block per row. The sum
// x + residual is rounded to the storage type, written to residual_out and
// normalized from that rounded value (as the Hugging Face models do); the
// sum of squares and the scaling are float32. residual_out may alias
// residual: each thread reads and writes the same elements.
#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

template <typename T, int N>
__global__ void rms_norm_kernel(const T* x, const T* residual, T* residual_out, const T* weight, T* out, int64_t cols,
                                float eps) {
  start_after_producers();
  using V = Vec<T, N>;
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * cols;
  const T* src = x + offset;
  float sq = 0.0f;
  for (int64_t c = threadIdx.x * N; c < cols; c += static_cast<int64_t>(blockDim.x) * N) {
    V a;
    a.load(x + offset + c);
    if (residual != nullptr) {
      V r;
      r.load(residual + offset + c);
#pragma unroll
      for (int i = 0; i < N; ++i) a.set(i, a.get(i) + r.get(i));
      a.store(residual_out + offset + c);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) sq += a.get(i) * a.get(i);
  }
  if (residual != nullptr) src = residual_out + offset;
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(cols) + eps);
  for (int64_t c = threadIdx.x * N; c < cols; c += static_cast<int64_t>(blockDim.x) * N) {
    V a, w, o;
    a.load(src + c);
    w.load(weight + c);
#pragma unroll
    for (int i = 0; i < N; ++i) o.set(i, a.get(i) * inv * w.get(i));
    o.store(out + offset + c);
  }
}

template <typename T, int N>
void launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  const int threads = static_cast<int>(std::clamp<int64_t>((p.cols / N + 31) / 32 * 32, 32, 1024));
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
