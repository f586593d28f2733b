// Row argmax over the logits: one block per split of a row (grid: splits ×
// rows); each thread keeps the best (value, column) of a strided share of
// its split, then a warp and a block reduction keep the better candidate by
// argmax_prefers' rule. Splits whose width and rows whose length are whole
// numbers of 16-byte vectors are read in vectors, several in flight per
// thread (one block reading a 128k-column row took 5-11 us in a decode
// step; scalar loads, 97 us).
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kArgmaxThreads = 256;

struct Best {
  float value;
  int32_t column;  // < 0: no candidate
};

// The better of two candidates (either may be none).
__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.column < 0) return a;
  if (a.column < 0) return b;
  return argmax_prefers(b.value, b.column, a.value, a.column) ? b : a;
}

// Thread i's share of split blockIdx.x of row blockIdx.y: the N-element
// vectors i, i + blockDim, ... of the split's valid columns (N = 1: single
// elements), kInFlight vectors loaded at a time.
template <typename T, int N>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const T* logits, float* values, int32_t* columns,
                                                                int64_t cols, int64_t valid_cols, int64_t width) {
  constexpr int kInFlight = 4;
  __shared__ Best warp_best[kArgmaxThreads / 32];
  start_after_producers();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * width;
  const int64_t end = min(begin + width, valid_cols);
  const T* row = logits + static_cast<int64_t>(blockIdx.y) * cols;
  const int64_t vectors = end > begin ? (end - begin) / N : 0;
  Best best{0.0f, -1};
  const auto consider = [&](float v, int64_t c) { best = better(best, Best{v, static_cast<int32_t>(c)}); };
  const int64_t step = blockDim.x;
  for (int64_t i = threadIdx.x; i < vectors; i += kInFlight * step) {
    Vec<T, N> v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i + k * step < vectors) v[k].load(row + begin + (i + k * step) * N);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k)
      if (i + k * step < vectors)
#pragma unroll
        for (int e = 0; e < N; ++e) consider(v[k].get(e), begin + (i + k * step) * N + e);
  }
  for (int64_t c = begin + vectors * N + threadIdx.x; c < end; c += step) consider(to_float(row[c]), c);
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
    const int64_t at = static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x;
    values[at] = b.column < 0 ? 0.0f : b.value;
    columns[at] = b.column;
  }
}

}  // namespace

void argmax(const ArgmaxParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  LS_OP_REQUIRE(p.splits() <= 65535 && p.rows <= 65535, "argmax", "{} splits of {} rows exceed the grid",
                p.splits(), p.rows);
  dispatch_dtype(p.dtype, "argmax", [&](auto t) {
    using T = decltype(t);
    constexpr int N = kVec16<T>;
    const bool vectors =
        p.cols % N == 0 && p.split_width() % N == 0 && reinterpret_cast<uintptr_t>(p.logits) % 16 == 0;
    const auto kernel = vectors ? argmax_kernel<T, N> : argmax_kernel<T, 1>;
    LS_LAUNCH("argmax_kernel", kernel, dim3(static_cast<unsigned>(p.splits()), static_cast<unsigned>(p.rows)),
              dim3(kArgmaxThreads), 0, stream, static_cast<const T*>(p.logits), p.values, p.columns, p.cols,
              p.valid_cols, p.split_width());
  });
}

}  // namespace lockstep::cuda
