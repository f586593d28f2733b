// Row argmax over the logits: one block per row; each thread keeps the best
// (value, column) of a strided share, then a warp and a block reduction
// keep the larger value, the lower column on ties. Rows whose length is a
// whole number of 16-byte vectors are read in vectors, several in flight per
// thread (one block reads a 128k-column row; scalar loads took 97 us).
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

// Thread i's share: the N-element vectors i, i + blockDim, ... of the valid
// columns (N = 1: single elements), kInFlight vectors loaded at a time.
template <typename T, int N>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const T* logits, float* values, int32_t* columns,
                                                                int64_t cols, int64_t valid_cols) {
  constexpr int kInFlight = 4;
  __shared__ Best warp_best[kArgmaxThreads / 32];
  start_after_producers();
  const T* row = logits + static_cast<int64_t>(blockIdx.x) * cols;
  const int64_t vectors = valid_cols / N;
  Best best{0.0f, -1};
  // The first valid value seeds the candidate so that a row of NaNs still picks a column.
  const auto consider = [&](float v, int64_t c) {
    if (best.column < 0 || v > best.value) best = Best{v, static_cast<int32_t>(c)};
  };
  const int64_t step = blockDim.x;
  for (int64_t i = threadIdx.x; i < vectors; i += kInFlight * step) {
    Vec<T, N> v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i + k * step < vectors) v[k].load(row + (i + k * step) * N);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i + k * step < vectors)
#pragma unroll
        for (int e = 0; e < N; ++e) consider(v[k].get(e), (i + k * step) * N + e);
  }
  for (int64_t c = vectors * N + threadIdx.x; c < valid_cols; c += step) consider(to_float(row[c]), c);
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
    constexpr int N = kVec16<T>;
    const bool vectors = p.cols % N == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
    const auto kernel = vectors ? argmax_kernel<T, N> : argmax_kernel<T, 1>;
    LS_LAUNCH("argmax_kernel", kernel, dim3(static_cast<unsigned>(p.rows)), dim3(kArgmaxThreads), 0, stream,
              static_cast<const T*>(p.logits), p.values, p.columns, p.cols, p.valid_cols);
  });
}

}  // namespace lockstep::cuda
