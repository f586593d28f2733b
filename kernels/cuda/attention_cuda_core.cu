// The CUDA-core attention kernel: float32, and head sizes other than 64 and
// 128, e.g. 80, 96 or 256 (kernels/attention.h; attention.cu has the op's
// design and the tensor-core kernel).
//
// One block per (token, kv head, chunk of up to 8 of its q heads, split).
// The block walks its key range in tiles of 128 keys: each thread scores one
// key against all the block's q heads (the K row is read once for the whole
// GQA group), each warp updates the running max and sum of some heads, and
// each warp accumulates p·V over a quarter of the tile's keys with every lane
// owning head_dim/32 output dimensions.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

using attention_detail::AttnArgs;
using attention_detail::kMaxGroup;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kThreads;  // keys per tile: one per thread when scoring

template <typename T, int HD>
struct AttnShared {
  float q[kMaxGroup][HD];  // pre-scaled queries
  float p[kMaxGroup][kTile];
  float m[kMaxGroup], l[kMaxGroup], alpha[kMaxGroup];
  float red[kWarps][kMaxGroup][HD];
};

// Scores this thread's key of the tile against the block's q heads into s.p.
template <typename T, int HD>
__device__ void score_tile(AttnShared<T, HD>& s, const T* k_base, int64_t pos_stride, int64_t j, int64_t end, int G) {
  float acc[kMaxGroup] = {};
  if (j < end) {
    constexpr int N = kVec16<T>;
    const T* k = k_base + j * pos_stride;
    // Up to 8 of the row's 16-byte chunks in flight at once (4 before; the
    // whole row, 16 at head_dim 64 in float32, spilled registers).
#pragma unroll(HD / N < 8 ? HD / N : 8)
    for (int c = 0; c < HD; c += N) {
      Vec<T, N> kv;
      kv.load(k + c);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        const float kf = kv.get(e);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g)
          if (g < G) acc[g] += kf * s.q[g][c + e];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) s.p[g][threadIdx.x] = j < end ? acc[g] : -INFINITY;
}

// Turns the tile's scores into probabilities under the updated running max.
template <typename T, int HD>
__device__ void softmax_tile(AttnShared<T, HD>& s, int G) {
  const int lane = threadIdx.x % 32;
  for (int g = threadIdx.x / 32; g < G; g += kWarps) {
    float mx = -INFINITY;
    for (int i = lane; i < kTile; i += 32) mx = fmaxf(mx, s.p[g][i]);
    mx = warp_max(mx);
    const float m_old = s.m[g];
    const float m_new = fmaxf(m_old, mx);  // finite: the tile holds a valid key
    float sum = 0.0f;
    for (int i = lane; i < kTile; i += 32) {
      const float e = expf(s.p[g][i] - m_new);
      s.p[g][i] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    __syncwarp();  // every lane has read s.m[g] before lane 0 updates it
    if (lane == 0) {
      const float alpha = expf(m_old - m_new);
      s.l[g] = s.l[g] * alpha + sum;
      s.m[g] = m_new;
      s.alpha[g] = alpha;
    }
  }
}

// Output dims per lane: the smallest power of two that covers HD with 32
// lanes (HD / kLaneDims lanes work, the rest idle: e.g. 20 at head_dim 80).
template <int HD>
constexpr int kLaneDims = HD <= 32 ? 1 : HD <= 64 ? 2 : HD <= 128 ? 4 : 8;

// Rescales this thread's accumulators by the tile's max update, then adds p·V
// over the tile's `keys` keys (from v_tile): each warp takes every kWarps-th
// key, each lane its kLaneDims output dims.
template <typename T, int HD>
__device__ void accumulate_tile(const AttnShared<T, HD>& s, float (&acc)[kMaxGroup][kLaneDims<HD>], const T* v_tile,
                                int64_t pos_stride, int keys, int G) {
  constexpr int E = kLaneDims<HD>;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] *= g < G ? s.alpha[g] : 0.0f;
  if (lane * E >= HD) return;
  // kRows V rows a warp in flight before their products, not one row's load
  // and then its products a key (forty-eighth session, H100, float32, with
  // the K loads' 8 chunks: the 1B shape's attention 18.8 -> 16.9 us a layer
  // at batch 1, decode +1.5%; the 0.5B shape's batch 1-4 +2-3%).
  constexpr int kRows = E >= 8 ? 4 : 8;
  for (int i0 = threadIdx.x / 32; i0 < keys; i0 += kWarps * kRows) {
    Vec<T, E> v[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      if (i0 + r * kWarps < keys) v[r].load(v_tile + (i0 + r * kWarps) * pos_stride + lane * E);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = i0 + r * kWarps;
      if (i >= keys) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= G) continue;
        const float pg = s.p[g][i];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] += pg * v[r].get(e);
      }
    }
  }
}

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs a) {
  constexpr int E = kLaneDims<HD>;
  static_assert(HD % E == 0 && HD % kVec16<T> == 0, "a lane's dims and a key's 16-byte chunks tile head_dim");
  __shared__ AttnShared<T, HD> s;
  start_after_producers();
  const int64_t t = blockIdx.x;
  const int64_t kvh = blockIdx.y / a.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y % a.head_chunks);
  const int64_t h0 = kvh * a.group + chunk * kMaxGroup;
  const int G = min(kMaxGroup, a.group - chunk * kMaxGroup);
  const int split = static_cast<int>(blockIdx.z);
  const int64_t len = static_cast<int64_t>(a.positions[t]) + 1;
  const int64_t lo = attention_detail::first_key(a, len - 1);
  const int64_t per_split = (len - lo + a.splits - 1) / a.splits;
  const int64_t begin = lo + split * per_split;
  const int64_t end = min(len, begin + per_split);
  const int64_t pos_stride = a.pos_stride;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  const T* q = static_cast<const T*>(a.qkv) + t * (a.num_heads + 2 * a.num_kv_heads) * HD + h0 * HD;
  for (int i = threadIdx.x; i < G * HD; i += kThreads) s.q[i / HD][i % HD] = to_float(q[i]) * a.scale;
  if (threadIdx.x < kMaxGroup) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.0f;
  }
  const int64_t cache_offset = static_cast<int64_t>(a.slots[t]) * a.slot_stride + kvh * a.head_stride;
  const T* k_base = static_cast<const T*>(a.k_cache) + cache_offset;
  const T* v_base = static_cast<const T*>(a.v_cache) + cache_offset;
  float acc[kMaxGroup][E] = {};
  __syncthreads();
  for (int64_t tile = begin; tile < end; tile += kTile) {
    score_tile<T, HD>(s, k_base, pos_stride, tile + threadIdx.x, end, G);
    __syncthreads();
    softmax_tile<T, HD>(s, G);
    __syncthreads();
    accumulate_tile<T, HD>(s, acc, v_base + tile * pos_stride, pos_stride,
                           static_cast<int>(min(static_cast<int64_t>(kTile), end - tile)), G);
    __syncthreads();
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e)
      if (lane * E < HD) s.red[warp][g][lane * E + e] = acc[g][e];
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += kThreads) {
    const int g = i / HD;
    const int d = i % HD;
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += s.red[w][g][d];
    const int64_t head = t * a.num_heads + h0 + g;
    if (a.splits == 1) {
      static_cast<T*>(a.out)[head * HD + d] = from_float<T>(s.l[g] > 0.0f ? sum / s.l[g] : 0.0f);
    } else {
      const int64_t entry = head * a.splits + split;
      a.ws_acc[entry * HD + d] = sum;
      if (d == 0) {
        a.ws_ml[entry * 2] = s.m[g];
        a.ws_ml[entry * 2 + 1] = s.l[g];
      }
    }
  }
  static_assert(attention_detail::merge_scratch_bytes(kMaxGroup) <= sizeof(s.p), "merge scratch exceeds the score buffer");
  if (a.splits > 1 && attention_detail::arrive_last_split(a, a.splits))  // s.p is free: the last tile is done
    attention_detail::merge_splits<T, HD>(a, a.splits, G, [&](int r) { return t * a.num_heads + h0 + r; },
                                          &s.p[0][0]);
}

template <typename T, int HD>
void launch_attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int group = static_cast<int>(p.num_heads / c.num_kv_heads);
  const int head_chunks = static_cast<int>(ceil_div(group, kMaxGroup));
  const int64_t base = p.tokens * c.num_kv_heads * head_chunks;
  int blocks_per_sm = 0;
  LS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, attention_kernel<T, HD>, kThreads, 0));
  const int64_t slots = int64_t{num_sms} * std::max(1, blocks_per_sm);
  const int splits = attention_detail::splits_that_fit(
      p, HD, attention_detail::splits_cuda_core(base, c.max_seq, slots, num_sms), base, num_sms);
  const AttnArgs args = attention_detail::make_attn_args(p, HD, group, head_chunks, splits, num_sms);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(c.num_kv_heads * head_chunks),
                  static_cast<unsigned>(splits));
  // Launched early like every kernel of the step, the blocks of a grid that
  // could spread one an SM crowd the SMs that free first: unused dynamic
  // shared memory keeps them at one an SM, as the tensor-core decode tiles
  // (attention.cu). Measured (forty-fifth session, H100, 0.5B shape in
  // float32): +12% at batch 1-2 (grids under one block an SM); padding larger
  // grids to their even share lost 3% at batch 32 (1024 blocks), so they are
  // left as they are.
  cudaFuncAttributes attributes{};
  LS_CHECK_CUDA(cudaFuncGetAttributes(&attributes, attention_kernel<T, HD>));
  const int own = static_cast<int>(attributes.sharedSizeBytes), per_sm = attention_detail::shared_memory_per_sm();
  // The opt-in limit at the one-an-SM padding whatever this launch takes, so
  // that it never falls below what a graph captured earlier launches with.
  LS_CHECK_CUDA(cudaFuncSetAttribute(attention_kernel<T, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     attention_cuda_core_padding_bytes(1, num_sms, per_sm, own)));
  const int padding = attention_cuda_core_padding_bytes(int64_t{grid.x} * grid.y * grid.z, num_sms, per_sm, own);
  LS_LAUNCH("attention_kernel", attention_kernel<T, HD>, grid, dim3(kThreads), padding, stream, args);
}

}  // namespace

void attention_detail::attention_cuda_core(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  dispatch_dtype(p.dtype, "attention", [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(p.cache.head_dim, "attention", [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      if constexpr (kTensorCoreAttention<T, HD>)
        LS_FAIL(ErrorKind::kInternal, "attention: head_dim {} in {} belongs to the tensor-core kernel", HD,
                dtype_name(p.dtype));
      else
        launch_attention<T, HD>(p, num_sms, stream);
    });
  });
}

}  // namespace lockstep::cuda
