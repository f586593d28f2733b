// Attention over the KV cache, for prefill and decode alike (kernels/attention.h):
// token t's query heads attend to positions [0, positions[t]] of its slot.
//
// One block per (token, kv head, chunk of up to 8 of its q heads, split of
// the sequence). The block walks its key range in tiles of 128 keys with an
// online softmax (flash-style: no score matrix in memory): each thread
// scores one key against all the block's q heads (the K row is read once for
// the whole GQA group), each warp updates the running max and sum of some
// heads, and each warp accumulates p·V over a quarter of the tile's keys
// with every lane owning head_dim/32 output dimensions. When the batch alone
// does not fill the GPU the sequence is split over several blocks
// (flash-decoding) and a second kernel merges the partial results. The split
// count depends on the batch size only, never on the sequence lengths, which
// the kernel reads from device memory: a captured graph stays valid as
// sequences grow.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kThreads;  // keys per tile: one per thread when scoring
constexpr int kMaxGroup = 8;     // q heads per block
constexpr int kMaxSplits = 32;
constexpr int kMinKeysPerSplit = 32;
constexpr int kMaxHeadDim = 256;

struct AttnArgs {
  const void* qkv;
  const void* k_cache;
  const void* v_cache;
  const int32_t* slots;
  const int32_t* positions;
  void* out;
  float* ws_acc;  // [tokens, heads, splits, head_dim] when splits > 1
  float* ws_ml;   // [tokens, heads, splits, 2]: running max and sum
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t slot_stride;
  int group;        // q heads per kv head
  int head_chunks;  // ceil(group / kMaxGroup)
  int splits;
  float scale;
};

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
#pragma unroll 4
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

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs a) {
  constexpr int E = HD / 32;  // output dims per lane
  __shared__ AttnShared<T, HD> s;
  const int64_t t = blockIdx.x;
  const int64_t kvh = blockIdx.y / a.head_chunks;
  const int chunk = static_cast<int>(blockIdx.y % a.head_chunks);
  const int64_t h0 = kvh * a.group + chunk * kMaxGroup;
  const int G = min(kMaxGroup, a.group - chunk * kMaxGroup);
  const int split = static_cast<int>(blockIdx.z);
  const int64_t len = static_cast<int64_t>(a.positions[t]) + 1;
  const int64_t per_split = (len + a.splits - 1) / a.splits;
  const int64_t begin = split * per_split;
  const int64_t end = min(len, begin + per_split);
  const int64_t pos_stride = a.num_kv_heads * HD;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;

  const T* q = static_cast<const T*>(a.qkv) + t * (a.num_heads + 2 * a.num_kv_heads) * HD + h0 * HD;
  for (int i = threadIdx.x; i < G * HD; i += kThreads) s.q[i / HD][i % HD] = to_float(q[i]) * a.scale;
  if (threadIdx.x < kMaxGroup) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.0f;
  }
  const int64_t cache_offset = static_cast<int64_t>(a.slots[t]) * a.slot_stride + kvh * HD;
  const T* k_base = static_cast<const T*>(a.k_cache) + cache_offset;
  const T* v_base = static_cast<const T*>(a.v_cache) + cache_offset;
  float acc[kMaxGroup][E] = {};
  __syncthreads();
  for (int64_t tile = begin; tile < end; tile += kTile) {
    score_tile<T, HD>(s, k_base, pos_stride, tile + threadIdx.x, end, G);
    __syncthreads();
    softmax_tile<T, HD>(s, G);
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= g < G ? s.alpha[g] : 0.0f;
    const int keys = static_cast<int>(min(static_cast<int64_t>(kTile), end - tile));
    for (int i = warp; i < keys; i += kWarps) {
      Vec<T, E> v;
      v.load(v_base + (tile + i) * pos_stride + lane * E);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= G) continue;
        const float pg = s.p[g][i];
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] += pg * v.get(e);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int e = 0; e < E; ++e) s.red[warp][g][lane * E + e] = acc[g][e];
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
}

// Merges the splits of one (token, head): one thread per output dimension.
template <typename T, int HD>
__global__ void __launch_bounds__(HD) attention_combine_kernel(const float* ws_acc, const float* ws_ml, T* out,
                                                                int splits) {
  const int64_t head = static_cast<int64_t>(blockIdx.x);
  const float* ml = ws_ml + head * splits * 2;
  float m = -INFINITY;
  for (int i = 0; i < splits; ++i)
    if (ml[2 * i + 1] > 0.0f) m = fmaxf(m, ml[2 * i]);
  float denom = 0.0f;
  float sum = 0.0f;
  for (int i = 0; i < splits; ++i) {
    if (ml[2 * i + 1] <= 0.0f) continue;
    const float w = expf(ml[2 * i] - m);
    denom += w * ml[2 * i + 1];
    sum += w * ws_acc[(head * splits + i) * HD + threadIdx.x];
  }
  out[head * HD + threadIdx.x] = from_float<T>(denom > 0.0f ? sum / denom : 0.0f);
}

int choose_splits(int64_t base_blocks, int64_t max_seq, int num_sms) {
  if (base_blocks >= 2 * num_sms) return 1;
  const int64_t fill = ceil_div(2 * num_sms, base_blocks);
  const int64_t by_length = std::max<int64_t>(1, max_seq / kMinKeysPerSplit);
  return static_cast<int>(std::min<int64_t>({kMaxSplits, fill, by_length}));
}

template <typename T, int HD>
void launch_attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int group = static_cast<int>(p.num_heads / c.num_kv_heads);
  const int head_chunks = static_cast<int>(ceil_div(group, kMaxGroup));
  const int64_t base = p.tokens * c.num_kv_heads * head_chunks;
  const int splits = choose_splits(base, c.max_seq, num_sms);
  const int64_t entries = p.tokens * p.num_heads * splits;
  float* ws = static_cast<float*>(p.workspace);
  if (splits > 1)
    LS_OP_REQUIRE(ws != nullptr && entries * (HD + 2) * 4 <= p.workspace_bytes, "attention",
                  "workspace of {} bytes is too small for {} partial results", p.workspace_bytes, entries);
  const AttnArgs args{.qkv = p.qkv,
                      .k_cache = p.k_cache,
                      .v_cache = p.v_cache,
                      .slots = p.slots,
                      .positions = p.positions,
                      .out = p.out,
                      .ws_acc = ws,
                      .ws_ml = splits > 1 ? ws + entries * HD : nullptr,
                      .num_heads = p.num_heads,
                      .num_kv_heads = c.num_kv_heads,
                      .slot_stride = c.slot_stride(),
                      .group = group,
                      .head_chunks = head_chunks,
                      .splits = splits,
                      .scale = p.scale};
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(c.num_kv_heads * head_chunks),
                  static_cast<unsigned>(splits));
  LS_LAUNCH("attention_kernel", attention_kernel<T, HD>, grid, dim3(kThreads), 0, stream, args);
  if (splits > 1)
    LS_LAUNCH("attention_combine_kernel", attention_combine_kernel<T, HD>,
              dim3(static_cast<unsigned>(p.tokens * p.num_heads)), dim3(HD), 0, stream, args.ws_acc, args.ws_ml,
              static_cast<T*>(p.out), splits);
}

}  // namespace

int64_t attention_workspace_bytes(int num_sms) {
  // Splits are used only while tokens·kv_heads·head_chunks < 2·SMs, and then
  // (blocks without splits)·splits < 4·SMs; each block holds <= 8 heads.
  return static_cast<int64_t>(4) * num_sms * kMaxGroup * (kMaxHeadDim + 2) * 4;
}

void attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  p.validate();
  if (p.tokens == 0) return;
  dispatch_dtype(p.dtype, "attention", [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(p.cache.head_dim, "attention",
                      [&](auto hd) { launch_attention<T, decltype(hd)::value>(p, num_sms, stream); });
  });
}

}  // namespace lockstep::cuda
