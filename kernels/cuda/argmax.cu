// Row argmax over the logits: one block per row; each thread keeps the best
// (value, column) of a strided share, then a warp and a block reduction
// keep the larger value, the lower column on ties.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kArgmaxThreads = 512;

struct Best {
  float value;
  int32_t column;
};

// The better of two candidates; column < 0 marks an empty one.
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.column < 0) return a;
  if (a.column < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.column < a.column)) return b;
  return a;
}

template <typename T>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const T* logits, float* values, int32_t* columns,
                                                                int64_t cols, int64_t valid_cols) {
  __shared__ Best warp_best[kArgmaxThreads / 32];
  start_after_producers();
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  Best best{0.0f, -1};
  for (int64_t c = threadIdx.x; c < valid_cols; c += blockDim.x) {
    const float v = to_float(row[c]);
    // The first valid value seeds the candidate so that a row of NaNs still picks a column.
    if (best.column < 0 || v > best.value) best = Best{v, static_cast<int32_t>(c)};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other{__shfl_xor_sync(0xffffffffu, best.value, o), __shfl_xor_sync(0xffffffffu, best.column, o)};
    best = better(best, other);
  }
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b = warp_best[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) b = better(b, warp_best[w]);
    values[blockIdx.x] = b.value;
    columns[blockIdx.x] = b.column;
  }
}

}  // namespace

void argmax(const ArgmaxParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  dispatch_dtype(p.dtype, "argmax", [&](auto t) {
    using T = decltype(t);
    LS_LAUNCH("argmax_kernel", argmax_kernel<T>, dim3(static_cast<unsigned>(p.rows)), dim3(kArgmaxThreads), 0, stream,
              static_cast<const T*>(p.logits), p.values, p.columns, p.cols, p.valid_cols);
  });
}

}  // namespace lockstep::cuda
