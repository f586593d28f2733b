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
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kTile = kThreads;  // keys per tile: one per thread when scoring
constexpr int kMaxGroup = 8;     // q heads per block
constexpr int kMaxSplits = 32;
constexpr int kMinKeysPerSplit = 64;  // a split shorter than a key tile (kTcKeys) half-fills it
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
  int64_t tokens;
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
  constexpr int E = HD >= 32 ? HD / 32 : 1;  // output dims per lane (lanes >= HD idle when HD < 32)
  __shared__ AttnShared<T, HD> s;
  start_after_producers();
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
    for (int i = warp; i < keys && lane * E < HD; i += kWarps) {
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
}

// Merges the splits of one (token, head): one thread per output dimension.
// The splits' (max, sum) pairs are read once, in parallel, into shared
// memory; each split's weight is computed once; then every thread's partial
// outputs are read with several loads in flight (an empty split's entry is
// read but weighted by nothing, as it may hold anything).
template <typename T, int HD>
__global__ void __launch_bounds__(HD) attention_combine_kernel(const float* ws_acc, const float* ws_ml, T* out,
                                                                int splits) {
  __shared__ float split_max[kMaxSplits];
  __shared__ float split_sum[kMaxSplits];
  __shared__ float split_weight[kMaxSplits];
  start_after_producers();
  const int64_t head = static_cast<int64_t>(blockIdx.x);
  const float* ml = ws_ml + head * splits * 2;
  for (int i = threadIdx.x; i < splits; i += HD) {
    split_max[i] = ml[2 * i];
    split_sum[i] = ml[2 * i + 1];
  }
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < splits; ++i)
    if (split_sum[i] > 0.0f) m = fmaxf(m, split_max[i]);
  for (int i = threadIdx.x; i < splits; i += HD)
    split_weight[i] = split_sum[i] > 0.0f ? expf(split_max[i] - m) : 0.0f;
  __syncthreads();
  float denom = 0.0f;
  float sum = 0.0f;
  const float* acc = ws_acc + head * splits * HD + threadIdx.x;
#pragma unroll 8
  for (int i = 0; i < splits; ++i) {
    const float partial = acc[i * HD];
    const float w = split_weight[i];
    denom += w > 0.0f ? w * split_sum[i] : 0.0f;
    sum += w > 0.0f ? w * partial : 0.0f;
  }
  out[head * HD + threadIdx.x] = from_float<T>(denom > 0.0f ? sum / denom : 0.0f);
}

int choose_splits(int64_t base_blocks, int64_t max_seq, int num_sms) {
  if (base_blocks >= 2 * num_sms) return 1;
  const int64_t fill = ceil_div(2 * num_sms, base_blocks);
  const int64_t by_length = std::max<int64_t>(1, max_seq / kMinKeysPerSplit);
  return static_cast<int>(std::min<int64_t>({kMaxSplits, fill, by_length}));
}

// The kernels' arguments. The workspace holds the splits' partial outputs,
// [tokens, heads, splits, head_dim], then their (max, sum) pairs.
AttnArgs make_attn_args(const AttentionParams& p, int head_dim, int group, int head_chunks, int splits) {
  float* ws = static_cast<float*>(p.workspace);
  const int64_t entries = p.tokens * p.num_heads * splits;
  return AttnArgs{.qkv = p.qkv,
                  .k_cache = p.k_cache,
                  .v_cache = p.v_cache,
                  .slots = p.slots,
                  .positions = p.positions,
                  .out = p.out,
                  .ws_acc = ws,
                  .ws_ml = splits > 1 ? ws + entries * head_dim : nullptr,
                  .tokens = p.tokens,
                  .num_heads = p.num_heads,
                  .num_kv_heads = p.cache.num_kv_heads,
                  .slot_stride = p.cache.slot_stride(),
                  .group = group,
                  .head_chunks = head_chunks,
                  .splits = splits,
                  .scale = p.scale};
}

// Merges the splits into the output (nothing to do with one split).
template <typename T, int HD>
void launch_combine(const AttentionParams& p, const AttnArgs& args, cudaStream_t stream) {
  if (args.splits == 1) return;
  LS_LAUNCH("attention_combine_kernel", attention_combine_kernel<T, HD>,
            dim3(static_cast<unsigned>(p.tokens * p.num_heads)), dim3(HD), 0, stream, args.ws_acc, args.ws_ml,
            static_cast<T*>(p.out), args.splits);
}

// ---- Tensor-core path (bf16/f16, head_dim 64 and 128) ----
//
// One block of 4 warps per (tile of query rows, kv head, split). The query
// rows of kv head h are the flattened pairs (token t, q head g of h's group),
// row t·group + g, so a tile of 16·RowWarps rows holds consecutive tokens'
// whole GQA groups. Tokens of one slot that are consecutive in the batch form
// a run; the block walks its runs one by one (a prefill chunk is one run; in
// a decode batch every token is its own run), and for each run streams the
// slot's keys in tiles of 64 through shared memory (cp.async, zero-filled
// past the end): S = Q·Kᵀ and O += P·V on mma.m16n8k16 with float32
// accumulators, online softmax in registers. RowWarps = 4 (prefill): each
// warp owns 16 rows and all 64 keys of a tile. RowWarps = 1 (decode): the
// warps share 16 rows and take 16 keys of each tile each, and merge their
// partial softmax states through shared memory at the end of a run.
constexpr int kTcThreads = 128;
constexpr int kTcKeys = 64;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <typename T, int HD>
struct TcTile {
  static constexpr int kLd = HD + 8;  // padded rows: conflict-free ldmatrix
  T k[kTcKeys][kLd];
  T v[kTcKeys][kLd];
};

// The query rows a thread's fragments cover: rows lane/4 and lane/4 + 8 of its warp's 16.
struct TcRows {
  int64_t token[2];
  int64_t head[2];  // q head index within the layer (local)
  bool valid[2];
};

template <typename T, int HD>
__device__ void load_query_fragments(const AttnArgs& a, const TcRows& rows, uint32_t (&qf)[HD / 16][4]) {
  const int c = threadIdx.x % 4;
  const int64_t stride = (a.num_heads + 2 * a.num_kv_heads) * HD;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const T* q = static_cast<const T*>(a.qkv) + rows.token[i] * stride + rows.head[i] * HD;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        qf[ks][2 * h + i] = rows.valid[i] ? *reinterpret_cast<const uint32_t*>(q + 16 * ks + 8 * h + 2 * c) : 0u;
  }
}

// Online-softmax state of one warp for its 16 rows (per thread: two rows).
template <int HD>
struct TcState {
  float m[2];  // running max, log2 units
  float l[2];  // this thread's part of the running sum
  float o[HD / 8][4];
  __device__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d][e] = 0.0f;
  }
};

// One warp's share of a key tile: keys [k0, k0 + Keys) of the tile in shared
// memory, which start at absolute position `tile_pos`. Row i may see keys up
// to limit[i] (-1: none).
template <typename T, int HD, int Keys>
__device__ void tc_attend_tile(const TcTile<T, HD>& s, int k0, int64_t tile_pos, const int64_t (&limit)[2],
                               float scale_log2, const uint32_t (&qf)[HD / 16][4], TcState<HD>& st) {
  const int lane = threadIdx.x % 32;
  const int c = lane % 4;
  float sc[Keys / 8][4];
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks += 2) {
      uint32_t b[4];
      ldmatrix_x4<false>(b, &s.k[k0 + 8 * j + lane % 8][16 * ks + 8 * (lane / 8)]);
      mma_16816<T>(sc[j], qf[ks], b[0], b[1]);
      mma_16816<T>(sc[j], qf[ks + 1], b[2], b[3]);
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int64_t key = tile_pos + k0 + 8 * j + 2 * c + e % 2;
      sc[j][e] = key <= limit[i] ? sc[j][e] * scale_log2 : -INFINITY;
      mx[i] = fmaxf(mx[i], sc[j][e]);
    }
  float alpha[2], base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float m_new = fmaxf(st.m[i], mx[i]);
    // No key seen yet (m_new = -inf): nothing to rescale, and every p is 0.
    alpha[i] = m_new == -INFINITY ? 1.0f : exp2f(st.m[i] - m_new);
    base[i] = m_new == -INFINITY ? 0.0f : m_new;
    st.m[i] = m_new;
    st.l[i] *= alpha[i];
  }
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[j][e] = exp2f(sc[j][e] - base[e / 2]);
      st.l[e / 2] += sc[j][e];
    }
#pragma unroll
  for (int d = 0; d < HD / 8; ++d)
#pragma unroll
    for (int e = 0; e < 4; ++e) st.o[d][e] *= alpha[e / 2];
#pragma unroll
  for (int kk = 0; kk < Keys / 16; ++kk) {
    const uint32_t pa[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]), pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                            pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                            pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
    const int m = lane / 8;
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn += 2) {
      uint32_t b[4];
      ldmatrix_x4<true>(b, &s.v[k0 + 16 * kk + (m % 2) * 8 + lane % 8][8 * dn + (m / 2) * 8]);
      mma_16816<T>(st.o[dn], pa, b[0], b[1]);
      mma_16816<T>(st.o[dn + 1], pa, b[2], b[3]);
    }
  }
}

// Writes one row's result: normalized output (one split) or the partial
// state for the combine kernel (m in natural-log units, as it expects).
template <typename T, int HD>
__device__ void tc_store_row(const AttnArgs& a, int64_t token, int64_t head, int d, float value_sum, float m_log2,
                             float l) {
  const int64_t h = token * a.num_heads + head;
  if (a.splits == 1) {
    static_cast<T*>(a.out)[h * HD + d] = from_float<T>(l > 0.0f ? value_sum / l : 0.0f);
    return;
  }
  const int64_t entry = h * a.splits + blockIdx.z;
  a.ws_acc[entry * HD + d] = value_sum;
  if (d == 0) {
    a.ws_ml[entry * 2] = l > 0.0f ? m_log2 * kLn2 : -INFINITY;
    a.ws_ml[entry * 2 + 1] = l;
  }
}

// RowWarps = 4: each warp writes its own rows.
template <typename T, int HD>
__device__ void tc_finish_rows(const AttnArgs& a, const TcRows& rows, const bool (&active)[2], TcState<HD>& st) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
    if (!active[i]) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        tc_store_row<T, HD>(a, rows.token[i], rows.head[i], 8 * d + 2 * c + e, st.o[d][2 * i + e], st.m[i], st.l[i]);
  }
}

// RowWarps = 1: the four warps hold the same 16 rows over different keys;
// merge them through shared memory (reusing the tile buffer) and write.
template <typename T, int HD>
__device__ void tc_merge_warps(const AttnArgs& a, int64_t row0, int64_t run_begin,
                               int64_t run_end, TcState<HD>& st, void* smem) {
  static_assert(4 * 16 * (HD + 2) * sizeof(float) <= sizeof(TcTile<T, HD>), "merge buffer exceeds the tile");
  float* so = static_cast<float*>(smem);  // [warp][row][HD]
  float* sml = so + 4 * 16 * HD;          // [warp][row][2]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  __syncthreads();  // the tile buffer is free
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int e = 0; e < 2; ++e) so[(warp * 16 + g + 8 * i) * HD + 8 * d + 2 * c + e] = st.o[d][2 * i + e];
    if (c == 0) {
      sml[(warp * 16 + g + 8 * i) * 2] = st.m[i];
      sml[(warp * 16 + g + 8 * i) * 2 + 1] = st.l[i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * HD; idx += kTcThreads) {
    const int r = idx / HD, d = idx % HD;
    const int64_t flat = row0 + r;
    const int64_t token = flat / a.group;
    if (token >= a.tokens || token < run_begin || token > run_end) continue;
    float m = -INFINITY;
    for (int w = 0; w < 4; ++w)
      if (sml[(w * 16 + r) * 2 + 1] > 0.0f) m = fmaxf(m, sml[(w * 16 + r) * 2]);
    float l = 0.0f, sum = 0.0f;
    for (int w = 0; w < 4; ++w) {
      const float lw = sml[(w * 16 + r) * 2 + 1];
      if (lw <= 0.0f) continue;
      const float scale = exp2f(sml[(w * 16 + r) * 2] - m);
      l += lw * scale;
      sum += so[(w * 16 + r) * HD + d] * scale;
    }
    tc_store_row<T, HD>(a, token, blockIdx.y * a.group + flat % a.group, d, sum, m, l);
  }
  __syncthreads();  // before the next run's tiles overwrite the buffer
}

template <typename T, int HD, int RowWarps>
__global__ void __launch_bounds__(kTcThreads) attention_tensor_core_kernel(AttnArgs a) {
  constexpr int kKeyWarps = 4 / RowWarps;
  constexpr int kWarpKeys = kTcKeys / kKeyWarps;
  __shared__ __align__(16) unsigned char smem[sizeof(TcTile<T, HD>)];
  auto& tile_buf = *reinterpret_cast<TcTile<T, HD>*>(smem);
  start_after_producers();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t kvh = blockIdx.y;
  const int64_t rows_total = a.tokens * a.group;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * 16 * RowWarps;
  const int64_t warp_row0 = row0 + 16 * (warp % RowWarps);
  const int k0 = kWarpKeys * (warp / RowWarps);

  TcRows rows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t flat = warp_row0 + lane / 4 + 8 * i;
    rows.valid[i] = flat < rows_total;
    rows.token[i] = rows.valid[i] ? flat / a.group : 0;
    rows.head[i] = kvh * a.group + flat % a.group;
  }
  uint32_t qf[HD / 16][4];
  load_query_fragments<T, HD>(a, rows, qf);
  const float scale_log2 = a.scale * kLog2e;
  const int64_t pos_stride = a.num_kv_heads * HD;
  const int64_t last_token = min(a.tokens - 1, (row0 + 16 * RowWarps - 1) / a.group);

  for (int64_t run_begin = row0 / a.group; run_begin <= last_token;) {
    const int32_t slot = a.slots[run_begin];
    int64_t run_end = run_begin;
    int64_t len = static_cast<int64_t>(a.positions[run_begin]) + 1;
    while (run_end < last_token && a.slots[run_end + 1] == slot) {
      ++run_end;
      len = max(len, static_cast<int64_t>(a.positions[run_end]) + 1);
    }
    bool active[2];
    int64_t limit[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      active[i] = rows.valid[i] && rows.token[i] >= run_begin && rows.token[i] <= run_end;
      limit[i] = active[i] ? a.positions[rows.token[i]] : -1;
    }
    const int64_t tiles_per_split = ceil_div(ceil_div(len, kTcKeys), a.splits);
    const int64_t begin = blockIdx.z * tiles_per_split * kTcKeys;
    const int64_t end = min(len, begin + tiles_per_split * kTcKeys);
    const T* k_base = static_cast<const T*>(a.k_cache) + slot * a.slot_stride + kvh * HD;
    const T* v_base = static_cast<const T*>(a.v_cache) + slot * a.slot_stride + kvh * HD;
    TcState<HD> st;
    st.reset();
    for (int64_t tile = begin; tile < end; tile += kTcKeys) {
      for (int i = threadIdx.x; i < kTcKeys * HD / 8; i += kTcThreads) {
        const int key = i / (HD / 8), col = (i % (HD / 8)) * 8;
        const bool in_range = tile + key < end;
        const int64_t offset = (in_range ? tile + key : 0) * pos_stride + col;
        cp_async_16(&tile_buf.k[key][col], k_base + offset, in_range);
        cp_async_16(&tile_buf.v[key][col], v_base + offset, in_range);
      }
      cp_async_wait_all();
      __syncthreads();
      tc_attend_tile<T, HD, kWarpKeys>(tile_buf, k0, tile, limit, scale_log2, qf, st);
      __syncthreads();
    }
    if constexpr (RowWarps == 1)
      tc_merge_warps<T, HD>(a, row0, run_begin, run_end, st, smem);
    else
      tc_finish_rows<T, HD>(a, rows, active, st);
    run_begin = run_end + 1;
  }
}

template <typename T, int HD>
void launch_attention_tensor_core(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int group = static_cast<int>(p.num_heads / c.num_kv_heads);
  // Prefill-like batches (long runs of one slot) fill 64-row tiles; decode
  // batches use 16-row tiles with the warps splitting the keys.
  const bool wide = p.tokens_per_sequence_hint * group >= 48;
  const int64_t tile_rows = wide ? 64 : 16;
  const int64_t row_tiles = ceil_div(p.tokens * group, tile_rows);
  const int64_t base = row_tiles * c.num_kv_heads;
  int splits = choose_splits(base, c.max_seq, num_sms);
  const int64_t bytes_per_split = p.tokens * p.num_heads * (HD + 2) * 4;
  splits = static_cast<int>(std::min<int64_t>(splits, std::max<int64_t>(1, p.workspace_bytes / bytes_per_split)));
  if (splits > 1) LS_OP_REQUIRE(p.workspace != nullptr, "attention", "no workspace for {} splits", splits);
  const AttnArgs args = make_attn_args(p, HD, group, 1, splits);
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(c.num_kv_heads),
                  static_cast<unsigned>(splits));
  if (wide)
    LS_LAUNCH("attention_tensor_core_kernel", (attention_tensor_core_kernel<T, HD, 4>), grid, dim3(kTcThreads), 0,
              stream, args);
  else
    LS_LAUNCH("attention_tensor_core_kernel", (attention_tensor_core_kernel<T, HD, 1>), grid, dim3(kTcThreads), 0,
              stream, args);
  launch_combine<T, HD>(p, args, stream);
}

template <typename T, int HD>
void launch_attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int group = static_cast<int>(p.num_heads / c.num_kv_heads);
  const int head_chunks = static_cast<int>(ceil_div(group, kMaxGroup));
  const int64_t base = p.tokens * c.num_kv_heads * head_chunks;
  const int splits = choose_splits(base, c.max_seq, num_sms);
  const int64_t entries = p.tokens * p.num_heads * splits;
  if (splits > 1)
    LS_OP_REQUIRE(p.workspace != nullptr && entries * (HD + 2) * 4 <= p.workspace_bytes, "attention",
                  "workspace of {} bytes is too small for {} partial results", p.workspace_bytes, entries);
  const AttnArgs args = make_attn_args(p, HD, group, head_chunks, splits);
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(c.num_kv_heads * head_chunks),
                  static_cast<unsigned>(splits));
  LS_LAUNCH("attention_kernel", attention_kernel<T, HD>, grid, dim3(kThreads), 0, stream, args);
  launch_combine<T, HD>(p, args, stream);
}

}  // namespace

int64_t attention_workspace_bytes(int num_sms) {
  // Splits are used only while the blocks without splits are fewer than
  // 2·SMs, and then (blocks without splits)·splits < 4·SMs; a block holds at
  // most 8 heads (CUDA cores) or 16 query rows (tensor cores) of one token
  // range. Larger tiles (prefill) use as many splits as this holds.
  return static_cast<int64_t>(4) * num_sms * std::max(kMaxGroup, 16) * (kMaxHeadDim + 2) * 4;
}

void attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  p.validate();
  if (p.tokens == 0) return;
  dispatch_dtype(p.dtype, "attention", [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(p.cache.head_dim, "attention", [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      if constexpr (!std::is_same_v<T, float> && (HD == 64 || HD == 128))
        launch_attention_tensor_core<T, HD>(p, num_sms, stream);
      else
        launch_attention<T, HD>(p, num_sms, stream);
    });
  });
}

}  // namespace lockstep::cuda
