// The step's chosen tokens (kernels/next_tokens.h): one block, a thread per
// row, each merging its row's candidates over the splits of every share.
// The published ids go to host-visible memory directly from the kernel, so
// the step needs no copy to the host after it.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kNextTokensThreads = 256;

__device__ int32_t best_candidate(const NextTokensParams& p, int64_t row) {
  const auto* values = static_cast<const float*>(p.candidates);
  const auto* columns = static_cast<const int32_t*>(p.candidates);
  const int64_t per_share = 2 * p.rows * p.splits;
  float best = 0.0f;
  int64_t best_id = -1;
  for (int64_t s = 0; s < p.shares && s * p.share_cols < p.vocab; ++s)
    for (int64_t k = 0; k < p.splits; ++k) {
      const int64_t at = s * per_share + row * p.splits + k;
      const int32_t column = columns[at + p.rows * p.splits];
      if (column < 0) continue;
      const int64_t id = s * p.share_cols + column;
      if (best_id < 0 || argmax_prefers(values[at], id, best, best_id)) best = values[at], best_id = id;
    }
  return static_cast<int32_t>(best_id < 0 ? 0 : best_id);
}

__global__ void __launch_bounds__(kNextTokensThreads) next_tokens_kernel(NextTokensParams p) {
  __shared__ int32_t* out;
  start_after_producers();
  if (threadIdx.x == 0) out = p.published + static_cast<int64_t>(*p.published_count % 2) * p.published_stride;
  __syncthreads();
  for (int64_t row = threadIdx.x; row < p.rows; row += blockDim.x) {
    const int32_t id = p.candidates ? best_candidate(p, row) : p.sampled[row];
    out[row] = id;
    if (p.tokens == nullptr) continue;
    p.tokens[row] = id;
    if (p.slots[row] != p.padding_slot) p.positions[row] = min(p.positions[row] + 1, p.max_position);
  }
  __syncthreads();
  if (threadIdx.x == 0) *p.published_count += 1;
}

}  // namespace

void next_tokens(const NextTokensParams& p, cudaStream_t stream) {
  p.validate();
  LS_LAUNCH("next_tokens_kernel", next_tokens_kernel, dim3(1), dim3(kNextTokensThreads), 0, stream, p);
}

}  // namespace lockstep::cuda
