#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu_threads.h"

namespace lockstep::cpu {

namespace {

void check_token(const KvCacheShape& c, int32_t slot, int32_t position) {
  LS_OP_REQUIRE(slot >= 0 && slot < c.num_slots, "kv cache", "slot {} outside [0, {})", slot, c.num_slots);
  LS_OP_REQUIRE(position >= 0 && position < c.max_seq, "kv cache", "position {} outside [0, {})",
                position, c.max_seq);
}

// acc[r * n + d] += e[r * e_stride + j] * v_j[d] for R heads and keys j in
// [first, len), v_j = v + j * v_stride: each element its own sum in key
// order, so the clones' vector lanes give the same bits as one element at a
// time (no FMA in any). A block of keys at a time, each value vector read
// once for the R heads while their sums stay in registers.
template <int R>
LOCKSTEP_SIMD_CLONES void add_weighted_values(double* acc, const double* e, int64_t e_stride, const float* v,
                                              int64_t v_stride, int64_t first, int64_t len, int64_t n) {
  using f64x8 = double __attribute__((vector_size(64)));
  using f32x8 = float __attribute__((vector_size(32)));
  constexpr int64_t kKeys = 8;
  for (int64_t j0 = first; j0 < len; j0 += kKeys) {
    const int64_t j1 = std::min(len, j0 + kKeys);
    int64_t d = 0;
    for (; d + 8 <= n; d += 8) {
      f64x8 sum[R];
      for (int r = 0; r < R; ++r) std::memcpy(&sum[r], acc + r * n + d, sizeof(f64x8));
      for (int64_t j = j0; j < j1; ++j) {
        f32x8 value;
        std::memcpy(&value, v + j * v_stride + d, sizeof value);
        const f64x8 wide = __builtin_convertvector(value, f64x8);
        for (int r = 0; r < R; ++r) sum[r] += (f64x8{} + e[r * e_stride + j]) * wide;
      }
      for (int r = 0; r < R; ++r) std::memcpy(acc + r * n + d, &sum[r], sizeof(f64x8));
    }
    for (; d < n; ++d)
      for (int64_t j = j0; j < j1; ++j)
        for (int r = 0; r < R; ++r) acc[r * n + d] += e[r * e_stride + j] * static_cast<double>(v[j * v_stride + d]);
  }
}

// Query heads of one kv head attended together, each key read once for all
// of them (a GQA group of more runs in several chunks).
constexpr int kMaxHeads = 4;

// R query heads against K keys: each output cpu::dot's sums (dot_tile's
// contract), so the tile's shape and instruction set leave the bits alone.
template <int R, int K>
void dot_keys(const float* const* q, const float* const* keys, int64_t n, float* out) {
#if defined(__x86_64__)
  if constexpr (K == 8) return dot_tile_avx512<R, K / 2, float>(q, keys, n, out);
#endif
  dot_tile_fastest<R, K>(q, keys, n, out);
}

// scores[r * len + j] = q[r] · key j * scale over the keys token t attends to
// (its window of its sequence's cache, kv head kv_head; len = its position
// + 1), K keys a tile; max_score[r] the maximum of head r's.
template <int R, int K>
void scaled_scores(const AttentionParams& p, const float* const* q, int64_t t, int64_t kv_head, float* scores,
                   float* max_score) {
  const KvCacheShape& c = p.cache;
  const auto* kc = static_cast<const float*>(p.k_cache);
  const int64_t len = p.positions[t] + 1;
  std::fill(max_score, max_score + R, -INFINITY);
  for (int64_t j = p.first_key(p.positions[t]); j < len; j += K) {
    const float* keys[K];
    for (int64_t k = 0; k < K; ++k) keys[k] = kc + c.offset(p.slots[t], std::min(j + k, len - 1), kv_head);
    float dots[R * K];
    dot_keys<R, K>(q, keys, c.head_dim, dots);
    for (int r = 0; r < R; ++r)
      for (int64_t k = 0; k < std::min<int64_t>(K, len - j); ++k) {
        scores[r * len + j + k] = dots[r * K + k] * p.scale;
        max_score[r] = std::max(max_score[r], scores[r * len + j + k]);
      }
  }
}

// Token t's query heads h0 .. h0 + R - 1 (one kv head's): the softmax of
// their scores in double and its weighted sum of the values, each head's
// exponentials, denominator and sums in key order. acc: kMaxHeads x head_dim,
// e: kMaxHeads x max_seq.
template <int R, int K>
void attend_heads(const AttentionParams& p, int64_t t, int64_t h0, float* scores, double* e, double* acc) {
  const KvCacheShape& c = p.cache;
  const int64_t kv_head = h0 / (p.num_heads / c.num_kv_heads);
  const int64_t first = p.first_key(p.positions[t]), len = p.positions[t] + 1;
  const float* q[R];
  for (int r = 0; r < R; ++r) q[r] = static_cast<const float*>(p.qkv) + t * p.qkv_stride() + (h0 + r) * c.head_dim;
  float max_score[R];
  scaled_scores<R, K>(p, q, t, kv_head, scores, max_score);
  double denom[R] = {};
  for (int r = 0; r < R; ++r)
    for (int64_t j = first; j < len; ++j) {
      e[r * len + j] = std::exp(static_cast<double>(scores[r * len + j] - max_score[r]));
      denom[r] += e[r * len + j];
    }
  std::fill(acc, acc + R * c.head_dim, 0.0);
  const float* v = static_cast<const float*>(p.v_cache) + c.offset(p.slots[t], 0, kv_head);
  add_weighted_values<R>(acc, e, len, v, c.position_stride(), first, len, c.head_dim);
  for (int r = 0; r < R; ++r) {
    float* o = static_cast<float*>(p.out) + (t * p.num_heads + h0 + r) * c.head_dim;
    for (int64_t d = 0; d < c.head_dim; ++d) o[d] = static_cast<float>(acc[r * c.head_dim + d] / denom[r]);
  }
}

using AttendHeads = void (*)(const AttentionParams&, int64_t, int64_t, float*, double*, double*);
// attend_heads for 1 .. kMaxHeads heads, K keys a tile.
template <int K>
constexpr AttendHeads kAttendHeads[kMaxHeads] = {attend_heads<1, K>, attend_heads<2, K>, attend_heads<3, K>,
                                                 attend_heads<4, K>};

}  // namespace

void kv_append(const KvAppendParams& p) {
  p.validate();
  require_f32(p.dtype, "kv_append");
  const KvCacheShape& c = p.cache;
  const int64_t row_stride = (p.num_heads + 2 * c.num_kv_heads) * c.head_dim;
  const int64_t kv_width = c.num_kv_heads * c.head_dim;
  const auto* qkv = static_cast<const float*>(p.qkv);
  for (int64_t t = 0; t < p.tokens; ++t) {
    check_token(c, p.slots[t], p.positions[t]);
    const float* k = qkv + t * row_stride + p.num_heads * c.head_dim;
    const float* v = k + kv_width;
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      const int64_t offset = c.offset(p.slots[t], p.positions[t], h);
      const auto bytes = static_cast<size_t>(c.head_dim) * 4;
      std::memcpy(static_cast<float*>(p.k_cache) + offset, k + h * c.head_dim, bytes);
      std::memcpy(static_cast<float*>(p.v_cache) + offset, v + h * c.head_dim, bytes);
    }
  }
}

// Work items are (token, chunk of a kv head's query heads), over the CPU
// threads; a group of G heads splits into ceil(G / kMaxHeads) chunks of
// near-equal size, or more (down to one head each) where that leaves threads
// idle (a decode step of few sequences on many cores). Every head's result
// is the same whichever chunk computes it. With AVX-512 the scores take 8
// keys a tile, else 4.
void attention(const AttentionParams& p) {
  p.validate();
  require_f32(p.dtype, "attention");
  const KvCacheShape& c = p.cache;
  const int64_t group = p.num_heads / c.num_kv_heads;
  const int64_t pairs = std::max<int64_t>(p.tokens * c.num_kv_heads, 1);  // (token, kv head)
  const int64_t chunks =  // per kv head
      std::clamp<int64_t>((threads() + pairs - 1) / pairs, (group + kMaxHeads - 1) / kMaxHeads, group);
  const int64_t items = p.tokens * c.num_kv_heads * chunks;
  for (int64_t t = 0; t < p.tokens; ++t) check_token(c, p.slots[t], p.positions[t]);
  const AttendHeads* attend = has_avx512() ? kAttendHeads<8> : kAttendHeads<4>;
#pragma omp parallel if (items > 1)
  {
    float* scores = thread_scratch<float, kScores>(static_cast<size_t>(kMaxHeads * c.max_seq));
    double* e = thread_scratch<double, kExponentials>(static_cast<size_t>(kMaxHeads * c.max_seq));
    double* acc = thread_scratch<double, kValues>(static_cast<size_t>(kMaxHeads * c.head_dim));
#pragma omp for schedule(dynamic, 2)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t t = item / (c.num_kv_heads * chunks), kv_head = item / chunks % c.num_kv_heads;
      const int64_t chunk = item % chunks;
      const int64_t first = group * chunk / chunks, end = group * (chunk + 1) / chunks;
      attend[end - first - 1](p, t, kv_head * group + first, scores, e, acc);
    }
  }
}

}  // namespace lockstep::cpu
