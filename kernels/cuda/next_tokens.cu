// The step's chosen tokens (kernels/next_tokens.h): one block, a warp per
// row, its lanes taking the row's candidates (splits of every share) in turn
// and the warp keeping the best by argmax_prefers, a total order over
// distinct ids, so the tree gives the sequential merge's id. (A thread per
// row walking its 32 candidates one after another took ~13 us a decode step
// at batch 32, a chain of dependent loads.)
// The published ids go to host-visible memory directly from the kernel, so
// the step needs no copy to the host after it.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kNextTokensThreads = 1024;
constexpr int kWarps = kNextTokensThreads / 32;

// Row `row`'s greedy id, merged by the calling warp (every lane gets it).
__device__ int32_t best_candidate(const NextTokensParams& p, int64_t row) {
  const auto* values = static_cast<const float*>(p.candidates);
  const auto* columns = static_cast<const int32_t*>(p.candidates);
  const int64_t per_share = 2 * p.rows * p.splits;
  float best = 0.0f;
  int64_t best_id = -1;
  const auto consider = [&](float v, int64_t id) {
    if (id >= 0 && (best_id < 0 || argmax_prefers(v, id, best, best_id))) best = v, best_id = id;
  };
  for (int64_t i = threadIdx.x % 32; i < p.shares * p.splits; i += 32) {
    const int64_t s = i / p.splits;
    if (s * p.share_cols >= p.vocab) break;  // padding shares, and all after them
    const int64_t at = s * per_share + row * p.splits + i % p.splits;
    const int32_t column = columns[at + p.rows * p.splits];
    consider(values[at], column < 0 ? -1 : s * p.share_cols + column);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t id = __shfl_xor_sync(0xffffffffu, static_cast<long long>(best_id), o);
    consider(v, id);
  }
  return best_id >= 0 && argmax_has_token(best) ? static_cast<int32_t>(best_id) : -1;
}

__global__ void __launch_bounds__(kNextTokensThreads) next_tokens_kernel(NextTokensParams p) {
  __shared__ int32_t* out;
  start_after_producers();
  if (threadIdx.x == 0) out = p.published + static_cast<int64_t>(*p.published_count % 2) * p.published_stride;
  __syncthreads();
  for (int64_t row = threadIdx.x / 32; row < p.rows; row += kWarps) {
    const int32_t id = p.candidates ? best_candidate(p, row) : p.sampled[row];
    if (threadIdx.x % 32 != 0) continue;
    out[row] = id;
    if (p.tokens == nullptr) continue;
    p.tokens[row] = max(id, 0);
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
