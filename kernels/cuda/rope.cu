// Per-head q/k RMSNorm (when weights are given) and rotary embedding, in
// place on the fused QKV rows. One block per (token, group of kRopeWarps
// heads), each warp one head, so that a decode token's 40-odd heads run in
// parallel rather than five after another per warp. Each block computes the
// token's cos/sin table in double precision (angles reach 1e5 radians and
// more at long context, where a float32 angle is off by several 1e-3). Values are read once, rotated in float32, written once;
// with the KV append fused in, the thread that rotates a k element also
// writes it to the cache, and the block copies the token's v there.
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
};

template <typename T>
__global__ void qk_norm_rope_kernel(T* qkv, const int32_t* positions, const float* inv_freq, const T* q_norm,
                                    const T* k_norm, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                    float eps, float cos_sin_scale, CacheTarget<T> cache) {
  __shared__ float cos_s[kMaxHalf];
  __shared__ float sin_s[kMaxHalf];
  start_after_producers();
  const int64_t t = blockIdx.x;
  const int64_t half = head_dim / 2;
  const double position = static_cast<double>(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(position * static_cast<double>(inv_freq[i]), &s, &c);
    cos_s[i] = static_cast<float>(c) * cos_sin_scale;
    sin_s[i] = static_cast<float>(s) * cos_sin_scale;
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  T* row = qkv + t * (num_heads + 2 * num_kv_heads) * head_dim;
  const int64_t kv_width = num_kv_heads * head_dim;
  const int64_t dst =
      cache.k_cache == nullptr ? 0 : cache.slots[t] * cache.slot_stride + positions[t] * cache.position_stride;
  // A token's kv heads are contiguous in the cache (KvCacheShape: head_stride() == head_dim).
  if (cache.k_cache != nullptr && blockIdx.y == 0)
    for (int64_t i = threadIdx.x; i < kv_width; i += blockDim.x)
      cache.v_cache[dst + i] = row[(num_heads + num_kv_heads) * head_dim + i];
  const int64_t h = static_cast<int64_t>(blockIdx.y) * kRopeWarps + threadIdx.x / 32;
  if (h < num_heads + num_kv_heads) {
    T* v = row + h * head_dim;
    const T* w = h < num_heads ? q_norm : k_norm;
    float inv = 1.0f;
    if (w != nullptr) {
      float sq = 0.0f;
      for (int64_t i = lane; i < head_dim; i += 32) sq += to_float(v[i]) * to_float(v[i]);
      inv = rsqrtf(warp_sum(sq) / static_cast<float>(head_dim) + eps);
    }
    for (int64_t i = lane; i < half; i += 32) {
      float a = to_float(v[i]) * inv;
      float b = to_float(v[i + half]) * inv;
      if (w != nullptr) {
        a *= to_float(w[i]);
        b *= to_float(w[i + half]);
      }
      const T ra = from_float<T>(a * cos_s[i] - b * sin_s[i]);
      const T rb = from_float<T>(b * cos_s[i] + a * sin_s[i]);
      v[i] = ra;
      v[i + half] = rb;
      if (h >= num_heads && cache.k_cache != nullptr) {
        T* k = cache.k_cache + dst + (h - num_heads) * head_dim;
        k[i] = ra;
        k[i + half] = rb;
      }
    }
  }
}

}  // namespace

void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream) {
  p.validate();
  LS_OP_REQUIRE(p.head_dim / 2 <= kMaxHalf, "qk_norm_rope", "head_dim {} above {}", p.head_dim, 2 * kMaxHalf);
  if (p.tokens == 0) return;
  dispatch_dtype(p.dtype, "qk_norm_rope", [&](auto t) {
    using T = decltype(t);
    CacheTarget<T> cache{};
    if (p.kv_append)
      cache = CacheTarget<T>{.k_cache = static_cast<T*>(p.kv_append->k_cache),
                             .v_cache = static_cast<T*>(p.kv_append->v_cache),
                             .slots = p.kv_append->slots,
                             .slot_stride = p.kv_append->cache.slot_stride(),
                             .position_stride = p.kv_append->cache.position_stride()};
    const dim3 grid(static_cast<unsigned>(p.tokens),
                    static_cast<unsigned>(ceil_div(p.num_heads + p.num_kv_heads, kRopeWarps)));
    LS_LAUNCH("qk_norm_rope_kernel", qk_norm_rope_kernel<T>, grid, dim3(kRopeWarps * 32), 0, stream, static_cast<T*>(p.qkv), p.positions, p.inv_freq,
              static_cast<const T*>(p.q_norm_weight), static_cast<const T*>(p.k_norm_weight), p.num_heads,
              p.num_kv_heads, p.head_dim, p.eps, p.cos_sin_scale, cache);
  });
}

}  // namespace lockstep::cuda
