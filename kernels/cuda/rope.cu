// Per-head q/k RMSNorm (when weights are given) and rotary embedding, in
// place on the fused QKV rows. Each block takes one token's heads (v heads
// included) from a group of kRopeWarps · heads_per_warp, each warp a head at
// a time: in decode a warp takes one head, so that a token's 40-odd heads run
// in parallel rather than five after another per warp; a long prompt's tokens
// fill the GPU by themselves, and there a block takes more of its token's
// heads, so that fewer blocks repeat the token's cos/sin table and row scale.
// Each block with a q or k head computes the token's cos/sin table in double
// precision (angles reach 1e5 radians and more at long context, where a
// float32 angle is off by several 1e-3).
// Values are read once (in a long prompt's launch two neighbours a lane
// access, where the head size and the pointers allow), rotated in float32,
// written once;
// with the KV append fused in, the thread that rotates a k element also
// writes it to the cache, and a v head's warp copies it there. After a
// product whose input norm is folded into its weights (RowScale), each block
// first computes its token's inverse RMS and takes every value as
// round(value · scale + bias), v included.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kRopeWarps = 8;
constexpr int kMaxHalf = 512;  // head_dim up to 1024
// The blocks a long prompt's launch keeps at least: several waves on a Hopper
// GPU (132 SMs, 3-4 of these 256-thread blocks resident on each).
constexpr int64_t kPromptBlocks = 2048;

// Where the fused KV append puts each token's k and v (null caches: no append).
template <typename T>
struct CacheTarget {
  T* k_cache;
  T* v_cache;
  const int32_t* slots;
  int64_t slot_stride;
  int64_t position_stride;
  int64_t head_stride;
};

// The kernel's view of QkNormRopeParams.
template <typename T>
struct RopeArgs {
  T* qkv;
  const int32_t* positions;
  const float* inv_freq;
  const T* q_norm;  // null: no q/k norm
  const T* k_norm;
  int64_t num_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t heads_per_warp;
  float eps;
  float cos_sin_scale;
  CacheTarget<T> cache;
  const T* rms_x;  // RowScale::x, null: the values are final
  int64_t rms_cols;
  float rms_eps;
  const T* bias;   // RowScale::bias, [row width] or null
};

// Elements i .. i + V - 1 of a token's row as the stage reads them: scaled
// and biased after a folded norm.
template <typename T, int V>
__device__ __forceinline__ void stage_values(const RopeArgs<T>& a, const T* row, int64_t i, float scale,
                                             float (&out)[V]) {
  Vec<T, V> x;
  x.load(row + i);
  Vec<T, V> b;
  if (a.bias != nullptr) b.load(a.bias + i);
#pragma unroll
  for (int j = 0; j < V; ++j)
    out[j] = a.rms_x == nullptr
                 ? x.get(j)
                 : to_float(from_float<T>(x.get(j) * scale + (a.bias != nullptr ? b.get(j) : 0.0f)));
}

// Head h of token t's row (a warp, V neighbours a lane access): normed when
// it has a weight, rotated, and for a k head also written at `dst` in the cache.
template <typename T, int V>
__device__ void norm_rotate_head(const RopeArgs<T>& a, T* row, int64_t h, int64_t dst, const float* cos_s,
                                 const float* sin_s, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t half = a.head_dim / 2;
  T* v = row + h * a.head_dim;
  const int64_t first = h * a.head_dim;
  const T* w = h < a.num_heads ? a.q_norm : a.k_norm;
  float inv = 1.0f;
  if (w != nullptr) {
    float sq = 0.0f;
    for (int64_t i = lane * V; i < a.head_dim; i += 32 * V) {
      float x[V];
      stage_values<T, V>(a, row, first + i, scale, x);
#pragma unroll
      for (int j = 0; j < V; ++j) sq += x[j] * x[j];
    }
    inv = rsqrtf(warp_sum(sq) / static_cast<float>(a.head_dim) + a.eps);
  }
  T* k = h >= a.num_heads && a.cache.k_cache != nullptr
             ? a.cache.k_cache + dst + (h - a.num_heads) * a.cache.head_stride
             : nullptr;
  for (int64_t i = lane * V; i < half; i += 32 * V) {
    float x[V], y[V];
    stage_values<T, V>(a, row, first + i, scale, x);
    stage_values<T, V>(a, row, first + i + half, scale, y);
    Vec<T, V> wx, wy;
    if (w != nullptr) wx.load(w + i), wy.load(w + i + half);
    Vec<float, V> c, s;
    c.load(cos_s + i);
    s.load(sin_s + i);
    Vec<T, V> rx, ry;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float xj = x[j] * inv, yj = y[j] * inv;
      if (w != nullptr) xj *= wx.get(j), yj *= wy.get(j);
      rx.set(j, xj * c.v[j] - yj * s.v[j]);
      ry.set(j, yj * c.v[j] + xj * s.v[j]);
    }
    rx.store(v + i);
    ry.store(v + i + half);
    if (k != nullptr) rx.store(k + i), ry.store(k + i + half);
  }
}

// V head h of token t's row (a warp, V neighbours a lane access): scaled in
// place after a folded norm, and written to the cache with the KV append.
template <typename T, int V>
__device__ void scale_append_v_head(const RopeArgs<T>& a, T* row, int64_t h, int64_t dst, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t first = h * a.head_dim;
  T* cache = a.cache.v_cache != nullptr
                 ? a.cache.v_cache + dst + (h - a.num_heads - a.num_kv_heads) * a.cache.head_stride
                 : nullptr;
  if (a.rms_x == nullptr && cache == nullptr) return;
  for (int64_t i = lane * V; i < a.head_dim; i += 32 * V) {
    float x[V];
    stage_values<T, V>(a, row, first + i, scale, x);
    Vec<T, V> out;
#pragma unroll
    for (int j = 0; j < V; ++j) out.set(j, x[j]);
    if (a.rms_x != nullptr) out.store(row + first + i);
    if (cache != nullptr) out.store(cache + i);
  }
}

// Block (t, g): token t's heads g·kRopeWarps·heads_per_warp onwards, warp w
// taking every kRopeWarps-th of them from the w-th.
template <typename T, int V>
__global__ void qk_norm_rope_kernel(RopeArgs<T> a) {
  __shared__ alignas(16) float cos_s[kMaxHalf];
  __shared__ alignas(16) float sin_s[kMaxHalf];
  start_after_producers();
  const int64_t t = blockIdx.x;
  const int64_t rotated_heads = a.num_heads + a.num_kv_heads;
  const int64_t all_heads = rotated_heads + a.num_kv_heads;
  const int64_t first_head = static_cast<int64_t>(blockIdx.y) * kRopeWarps * a.heads_per_warp;
  const double position = static_cast<double>(a.positions[t]);
  // A block of v heads only (the last ones of a token) rotates nothing.
  const bool rotates = first_head < rotated_heads;
  for (int64_t i = threadIdx.x; rotates && i < a.head_dim / 2; i += blockDim.x) {
    double s, c;
    sincos(position * static_cast<double>(a.inv_freq[i]), &s, &c);
    cos_s[i] = static_cast<float>(c) * a.cos_sin_scale;
    sin_s[i] = static_cast<float>(s) * a.cos_sin_scale;
  }
  const float scale = a.rms_x != nullptr ? inverse_rms(a.rms_x + t * a.rms_cols, a.rms_cols, a.rms_eps) : 1.0f;
  __syncthreads();
  T* row = a.qkv + t * all_heads * a.head_dim;
  const CacheTarget<T>& cache = a.cache;
  const int64_t dst =
      cache.k_cache == nullptr ? 0 : cache.slots[t] * cache.slot_stride + a.positions[t] * cache.position_stride;
  for (int64_t n = 0; n < a.heads_per_warp; ++n) {
    const int64_t h = first_head + n * kRopeWarps + threadIdx.x / 32;
    if (h < rotated_heads)
      norm_rotate_head<T, V>(a, row, h, dst, cos_s, sin_s, scale);
    else if (h < all_heads)
      scale_append_v_head<T, V>(a, row, h, dst, scale);
  }
}

// Heads per warp: as many as keep the launch at kPromptBlocks blocks or more
// (one in decode), at most all of a token's.
int64_t rope_heads_per_warp(int64_t tokens, int64_t all_heads) {
  const int64_t groups = ceil_div(all_heads, kRopeWarps);  // a token's blocks at one head a warp
  return std::clamp<int64_t>(tokens * groups / kPromptBlocks, 1, groups);
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream) { qk_norm_rope(p, nullptr, stream); }

void qk_norm_rope(const QkNormRopeParams& p, const RowScale* scale, cudaStream_t stream) {
  p.validate();
  LS_OP_REQUIRE(p.head_dim / 2 <= kMaxHalf, "qk_norm_rope", "head_dim {} above {}", p.head_dim, 2 * kMaxHalf);
  if (p.tokens == 0) return;
  dispatch_dtype(p.dtype, "qk_norm_rope", [&](auto t) {
    using T = decltype(t);
    RopeArgs<T> args{.qkv = static_cast<T*>(p.qkv),
                      .positions = p.positions,
                      .inv_freq = p.inv_freq,
                      .q_norm = static_cast<const T*>(p.q_norm_weight),
                      .k_norm = static_cast<const T*>(p.k_norm_weight),
                      .num_heads = p.num_heads,
                      .num_kv_heads = p.num_kv_heads,
                      .head_dim = p.head_dim,
                      .heads_per_warp = 1,
                      .eps = p.eps,
                      .cos_sin_scale = p.cos_sin_scale,
                      .cache = {},
                      .rms_x = scale != nullptr ? static_cast<const T*>(scale->x) : nullptr,
                      .rms_cols = scale != nullptr ? scale->cols : 0,
                      .rms_eps = scale != nullptr ? scale->eps : 0.0f,
                      .bias = scale != nullptr ? static_cast<const T*>(scale->bias) : nullptr};
    if (p.kv_append)
      args.cache = CacheTarget<T>{.k_cache = static_cast<T*>(p.kv_append->k_cache),
                                  .v_cache = static_cast<T*>(p.kv_append->v_cache),
                                  .slots = p.kv_append->slots,
                                  .slot_stride = p.kv_append->cache.slot_stride(),
                                  .position_stride = p.kv_append->cache.position_stride(),
                                  .head_stride = p.kv_append->cache.head_stride()};
    const int64_t all_heads = p.num_heads + 2 * p.num_kv_heads;
    args.heads_per_warp = rope_heads_per_warp(p.tokens, all_heads);
    const dim3 grid(static_cast<unsigned>(p.tokens),
                    static_cast<unsigned>(ceil_div(all_heads, kRopeWarps * args.heads_per_warp)));
    // Two neighbours a lane access, for a long prompt only: the head's halves
    // even, every pointer the kernel offsets aligned to two elements. In a
    // decode step the pair kernel ran faster itself but slowed the attention
    // after it more (llama3-8b at batch 32 on an H100: 7.54 ms a step against
    // 7.49 with one element a lane access, the same as before the pairs).
    const size_t pair = 2 * sizeof(T);
    const bool pairs = args.heads_per_warp > 1 && p.head_dim % 4 == 0 && aligned_to(args.qkv, pair) &&
                       aligned_to(args.q_norm, pair) && aligned_to(args.k_norm, pair) && aligned_to(args.bias, pair) &&
                       aligned_to(args.cache.k_cache, pair) && aligned_to(args.cache.v_cache, pair);
    if (pairs)
      LS_LAUNCH("qk_norm_rope_kernel", (qk_norm_rope_kernel<T, 2>), grid, dim3(kRopeWarps * 32), 0, stream, args);
    else
      LS_LAUNCH("qk_norm_rope_kernel", (qk_norm_rope_kernel<T, 1>), grid, dim3(kRopeWarps * 32), 0, stream, args);
  });
}

}  // namespace lockstep::cuda
