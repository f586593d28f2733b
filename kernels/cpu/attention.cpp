#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

namespace {

void check_token(const KvCacheShape& c, int32_t slot, int32_t position) {
  LS_OP_REQUIRE(slot >= 0 && slot < c.num_slots, "kv cache", "slot {} outside [0, {})", slot, c.num_slots);
  LS_OP_REQUIRE(position >= 0 && position < c.max_seq, "kv cache", "position {} outside [0, {})",
                position, c.max_seq);
}

// acc[d] += e * v[d]: each element its own sum, so the AVX2 clone's four
// lanes give the same bits as one at a time (no FMA in either).
LOCKSTEP_AVX2_CLONES void add_weighted(double* acc, double e, const float* v, int64_t n) {
  for (int64_t d = 0; d < n; ++d) acc[d] += e * static_cast<double>(v[d]);
}

// scores[j] = q · key j * scale over the keys token t attends to (its window
// of its sequence's cache, kv head kv_head), four keys a dot_tile
// (cpu::dot's sums, each); returns their maximum.
float scaled_scores(const AttentionParams& p, const float* q, int64_t t, int64_t kv_head, float* scores) {
  const KvCacheShape& c = p.cache;
  const auto* kc = static_cast<const float*>(p.k_cache);
  const int64_t len = p.positions[t] + 1;
  float max_score = -INFINITY;
  for (int64_t j = p.first_key(p.positions[t]); j < len; j += 4) {
    const float* keys[4];
    for (int64_t k = 0; k < 4; ++k) keys[k] = kc + c.offset(p.slots[t], std::min(j + k, len - 1), kv_head);
    float dots[4];
    dot_tile_fastest<1, 4>(&q, keys, c.head_dim, dots);
    for (int64_t k = 0; k < std::min<int64_t>(4, len - j); ++k) {
      scores[j + k] = dots[k] * p.scale;
      max_score = std::max(max_score, scores[j + k]);
    }
  }
  return max_score;
}

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
    // A token's kv heads are contiguous in the cache (head_stride() == head_dim).
    const int64_t offset = c.offset(p.slots[t], p.positions[t], 0);
    std::memcpy(static_cast<float*>(p.k_cache) + offset, k, static_cast<size_t>(kv_width) * 4);
    std::memcpy(static_cast<float*>(p.v_cache) + offset, v, static_cast<size_t>(kv_width) * 4);
  }
}

void attention(const AttentionParams& p) {
  p.validate();
  require_f32(p.dtype, "attention");
  const KvCacheShape& c = p.cache;
  const int64_t group = p.num_heads / c.num_kv_heads;
  const auto* qkv = static_cast<const float*>(p.qkv);
  const auto* vc = static_cast<const float*>(p.v_cache);
  auto* out = static_cast<float*>(p.out);
  for (int64_t t = 0; t < p.tokens; ++t) check_token(c, p.slots[t], p.positions[t]);
  // (token, head) pairs over the CPU threads, each with its own scratch.
#pragma omp parallel if (p.tokens * p.num_heads > 1)
  {
    float* scores = thread_scratch<float, kScores>(static_cast<size_t>(c.max_seq));
    double* acc = thread_scratch<double, kValues>(static_cast<size_t>(c.head_dim));
#pragma omp for schedule(dynamic, 4)
    for (int64_t th = 0; th < p.tokens * p.num_heads; ++th) {
      const int64_t t = th / p.num_heads, h = th % p.num_heads;
      const int64_t first = p.first_key(p.positions[t]), len = p.positions[t] + 1;
      const float* q = qkv + t * p.qkv_stride() + h * c.head_dim;
      const int64_t kvh = h / group;
      const float max_score = scaled_scores(p, q, t, kvh, scores);
      double denom = 0.0;
      std::fill(acc, acc + c.head_dim, 0.0);
      for (int64_t j = first; j < len; ++j) {
        double e = std::exp(static_cast<double>(scores[j] - max_score));
        denom += e;
        add_weighted(acc, e, vc + c.offset(p.slots[t], j, kvh), c.head_dim);
      }
      float* o = out + t * p.num_heads * c.head_dim + h * c.head_dim;
      for (int64_t d = 0; d < c.head_dim; ++d) o[d] = static_cast<float>(acc[d] / denom);
    }
  }
}

}  // namespace lockstep::cpu
