// What the two attention kernels share: attention.cu (tensor cores, and the
// op's entry point) and attention_cuda_core.cu (CUDA cores). Their
// arguments, the split bookkeeping of flash-decoding (each split block writes
// its partial result to the workspace; the last to finish merges them) and
// the host-side split rules (attention_split.cu). attention.cu describes the
// design.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"

namespace lockstep::cuda::attention_detail {

constexpr int kMaxGroup = 8;  // q heads per block of the CUDA-core kernel
constexpr int kMaxSplits = 32;

// The tensor-core kernel takes bf16/f16 from head_dim 16 (its mma steps are
// 16 dimensions deep; a multiple of 8 ends in half a step); the CUDA-core
// kernel float32 and head_dim 8.
template <typename T, int HD>
inline constexpr bool kTensorCoreAttention = !std::is_same_v<T, float> && HD >= 16 && HD <= kMostHeadDim;

struct AttnArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* slots;
  const int32_t* positions;
  void* out;
  int* counters;  // per (blockIdx.x, blockIdx.y): split blocks finished so far (0 between launches)
  float* ws_acc;  // [tokens, heads, splits, head_dim] when splits > 1
  float* ws_ml;   // [tokens, heads, splits, 2]: running max and sum
  int64_t tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t slot_stride;
  int64_t pos_stride;   // elements between consecutive positions of one kv head
  int64_t head_stride;  // elements between kv heads at one position
  int group;        // q heads per kv head
  int head_chunks;  // blocks per (token, kv head) along the group (CUDA cores, tensor-core decode)
  int splits;
  float scale;
  int64_t window;        // AttentionParams::window (0: none)
  bool no_lower_writes;  // AttentionParams::no_lower_writes
  int64_t row_tile0;     // tensor-core prefill: the launch's first 64-row tile
};

// The first key a token at `position` attends to (AttentionParams::first_key).
__device__ inline int64_t first_key(const AttnArgs& a, int64_t position) {
  return window_first_key(a.window, position);
}

// Called by every thread of a split block once its partial results are
// written: true in the block that finishes last among the `used` splits of
// its rows (the first `used` of a.splits; the others take no part), which
// then merges them. That block sets the count back to zero for the next
// launch.
__device__ inline bool arrive_last_split(const AttnArgs& a, int used) {
  __shared__ int arrived;
  __threadfence();  // this block's partial results are visible before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = a.counters + blockIdx.y * gridDim.x + blockIdx.x;
    arrived = atomicAdd(counter, 1);
    if (arrived == used - 1) *counter = 0;
  }
  __syncthreads();
  return arrived == used - 1;
}

// Shared memory the merge needs for `rows` rows: two floats per (row, split).
__host__ __device__ constexpr int merge_scratch_bytes(int rows) { return 2 * rows * kMaxSplits * 4; }

// The last split block's merge: for each of its `rows` query rows (row r is
// head row head_row(r) = token·num_heads + head), the output from the first
// `used` splits' (max, sum, partial output), read from L2 (other blocks
// wrote them; a head row's entries are a.splits apart). The (max, sum)
// pairs of all rows and splits are read at once into `scratch`
// (merge_scratch_bytes(rows) of shared memory) and turned into one weight
// per split; then one thread per four output dimensions of a row sums the
// weighted partial outputs with all their loads in flight. An empty split
// (sum 0) has weight 0 and adds nothing, whatever its partial output holds.
template <typename T, int HD, typename HeadRow>
__device__ void merge_splits(const AttnArgs& a, int used, int rows, HeadRow head_row, float* scratch) {
  const int n = rows * used;
  float* weight = scratch;  // [row][split]: the split's max, then its weight
  float* sum = scratch + n;  // [row][split]: the split's softmax sum
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float* ml = a.ws_ml + (head_row(i / used) * a.splits + i % used) * 2;
    weight[i] = __ldcg(ml);
    sum[i] = __ldcg(ml + 1);
  }
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float* w = weight + r * used;
    const float* l = sum + r * used;
    float m = -INFINITY;
    for (int i = 0; i < used; ++i)
      if (l[i] > 0.0f) m = fmaxf(m, w[i]);
    float denom = 0.0f;
    for (int i = 0; i < used; ++i) {
      w[i] = l[i] > 0.0f ? expf(w[i] - m) : 0.0f;
      denom += w[i] * l[i];
    }
    for (int i = 0; i < used; ++i) w[i] = denom > 0.0f ? w[i] / denom : 0.0f;
  }
  __syncthreads();
  constexpr int kQuads = HD / 4;
  for (int item = threadIdx.x; item < rows * kQuads; item += blockDim.x) {
    const int r = item / kQuads;
    const int d = item % kQuads * 4;
    const int64_t h = head_row(r);
    const float* w = weight + r * used;
    const float* acc = a.ws_acc + h * a.splits * HD + d;
    float o[4] = {};
#pragma unroll 16
    for (int i = 0; i < used; ++i) {
      const float4 partial = __ldcg(reinterpret_cast<const float4*>(acc + i * HD));
      if (w[i] <= 0.0f) continue;
      o[0] += w[i] * partial.x, o[1] += w[i] * partial.y, o[2] += w[i] * partial.z, o[3] += w[i] * partial.w;
    }
    Vec<T, 4> out;
#pragma unroll
    for (int e = 0; e < 4; ++e) out.set(e, o[e]);
    out.store(static_cast<T*>(a.out) + h * HD + d);
  }
}

// Host side, in attention_split.cu: the split rules (splits per block of a
// split-free grid of `base_blocks` blocks: the prefill tiles', the
// CUDA-core kernel's on a GPU holding `slots` at once, the tensor-core decode
// tiles' at one block an SM), the splits the workspace holds (at most
// `wanted`), and the kernel arguments for a launch.
int prefill_splits(int64_t base_blocks, int64_t max_seq, int num_sms);
int splits_by_waves(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms);
int splits_one_block_per_sm(int64_t base_blocks, int64_t max_seq, int num_sms);
int splits_cuda_core(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms);
int splits_that_fit(const AttentionParams& p, int head_dim, int wanted, int64_t base_blocks, int num_sms);
AttnArgs make_attn_args(const AttentionParams& p, int head_dim, int group, int head_chunks, int splits, int num_sms);
// The current device's shared memory per SM, in bytes.
int shared_memory_per_sm();

// The CUDA-core kernel's launcher (attention_cuda_core.cu), for every dtype
// and head_dim that kTensorCoreAttention leaves out.
void attention_cuda_core(const AttentionParams& p, int num_sms, cudaStream_t stream);

}  // namespace lockstep::cuda::attention_detail
