// Per-head q/k RMSNorm (when weights are given) and rotary embedding, in
// place on the fused QKV rows. One block per (token, group of kRopeWarps
// heads, v heads included), each warp one head, so that a decode token's
// 40-odd heads run in parallel rather than five after another per warp.
// Each block with a q or k head computes the token's cos/sin table in double
// precision (angles reach 1e5 radians and more at long context, where a
// float32 angle is off by several 1e-3).
// Values are read once, rotated in float32, written once;
// with the KV append fused in, the thread that rotates a k element also
// writes it to the cache, and a v head's warp copies it there. After a
// product whose input norm is folded into its weights (RowScale), each block
// first computes its token's inverse RMS and takes every value as
// round(value · scale + bias), v included.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr int kRopeWarps = 8;
constexpr int kMaxHalf = 512;  // head_dim up to 1024

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
  float eps;
  float cos_sin_scale;
  CacheTarget<T> cache;
  const T* rms_x;  // RowScale::x, null: the values are final
  int64_t rms_cols;
  float rms_eps;
  const T* bias;   // RowScale::bias, [row width] or null
};

// Element i of a token's row as the stage reads it: scaled and biased after a folded norm.
template <typename T>
__device__ __forceinline__ float stage_value(const RopeArgs<T>& a, const T* row, int64_t i, float scale) {
  if (a.rms_x == nullptr) return to_float(row[i]);
  return to_float(from_float<T>(to_float(row[i]) * scale + (a.bias != nullptr ? to_float(a.bias[i]) : 0.0f)));
}

// Head h of token t's row (a warp): normed when it has a weight, rotated,
// and for a k head also written at `dst` in the cache.
template <typename T>
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
    for (int64_t i = lane; i < a.head_dim; i += 32) {
      const float x = stage_value(a, row, first + i, scale);
      sq += x * x;
    }
    inv = rsqrtf(warp_sum(sq) / static_cast<float>(a.head_dim) + a.eps);
  }
  T* k = h >= a.num_heads && a.cache.k_cache != nullptr
             ? a.cache.k_cache + dst + (h - a.num_heads) * a.cache.head_stride
             : nullptr;
  for (int64_t i = lane; i < half; i += 32) {
    float x = stage_value(a, row, first + i, scale) * inv;
    float y = stage_value(a, row, first + i + half, scale) * inv;
    if (w != nullptr) {
      x *= to_float(w[i]);
      y *= to_float(w[i + half]);
    }
    const T rx = from_float<T>(x * cos_s[i] - y * sin_s[i]);
    const T ry = from_float<T>(y * cos_s[i] + x * sin_s[i]);
    v[i] = rx;
    v[i + half] = ry;
    if (k != nullptr) k[i] = rx, k[i + half] = ry;
  }
}

// V head h of token t's row (a warp): scaled in place after a folded norm,
// and written to the cache with the KV append.
template <typename T>
__device__ void scale_append_v_head(const RopeArgs<T>& a, T* row, int64_t h, int64_t dst, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t first = h * a.head_dim;
  T* cache = a.cache.v_cache != nullptr
                 ? a.cache.v_cache + dst + (h - a.num_heads - a.num_kv_heads) * a.cache.head_stride
                 : nullptr;
  if (a.rms_x == nullptr && cache == nullptr) return;
  for (int64_t i = lane; i < a.head_dim; i += 32) {
    const T v = from_float<T>(stage_value(a, row, first + i, scale));
    if (a.rms_x != nullptr) row[first + i] = v;
    if (cache != nullptr) cache[i] = v;
  }
}

template <typename T>
__global__ void qk_norm_rope_kernel(RopeArgs<T> a) {
  __shared__ float cos_s[kMaxHalf];
  __shared__ float sin_s[kMaxHalf];
  start_after_producers();
  const int64_t t = blockIdx.x;
  const double position = static_cast<double>(a.positions[t]);
  // A block of v heads only (the last ones of a token) rotates nothing.
  const bool rotates = static_cast<int64_t>(blockIdx.y) * kRopeWarps < a.num_heads + a.num_kv_heads;
  for (int64_t i = threadIdx.x; rotates && i < a.head_dim / 2; i += blockDim.x) {
    double s, c;
    sincos(position * static_cast<double>(a.inv_freq[i]), &s, &c);
    cos_s[i] = static_cast<float>(c) * a.cos_sin_scale;
    sin_s[i] = static_cast<float>(s) * a.cos_sin_scale;
  }
  const float scale = a.rms_x != nullptr ? inverse_rms(a.rms_x + t * a.rms_cols, a.rms_cols, a.rms_eps) : 1.0f;
  __syncthreads();
  T* row = a.qkv + t * (a.num_heads + 2 * a.num_kv_heads) * a.head_dim;
  const CacheTarget<T>& cache = a.cache;
  const int64_t dst =
      cache.k_cache == nullptr ? 0 : cache.slots[t] * cache.slot_stride + a.positions[t] * cache.position_stride;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kRopeWarps + threadIdx.x / 32;
  if (h < a.num_heads + a.num_kv_heads)
    norm_rotate_head(a, row, h, dst, cos_s, sin_s, scale);
  else if (h < a.num_heads + 2 * a.num_kv_heads)
    scale_append_v_head(a, row, h, dst, scale);
}

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
    const dim3 grid(static_cast<unsigned>(p.tokens),
                    static_cast<unsigned>(ceil_div(p.num_heads + 2 * p.num_kv_heads, kRopeWarps)));
    LS_LAUNCH("qk_norm_rope_kernel", qk_norm_rope_kernel<T>, grid, dim3(kRopeWarps * 32), 0, stream, args);
  });
}

}  // namespace lockstep::cuda
