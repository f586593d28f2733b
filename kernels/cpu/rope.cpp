#include "kernels/rope.h"

#include <cmath>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

namespace {

void head_rms_norm(float* v, const float* w, int64_t n, float eps) {
  double sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sq += static_cast<double>(v[i]) * v[i];
  float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) v[i] = v[i] * inv * w[i];
}

void rotate(float* v, const float* inv_freq, int64_t head_dim, int32_t position, float scale) {
  int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    double angle = static_cast<double>(position) * inv_freq[i];
    float c = static_cast<float>(std::cos(angle)) * scale;
    float s = static_cast<float>(std::sin(angle)) * scale;
    float a = v[i];
    float b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

}  // namespace

void qk_norm_rope(const QkNormRopeParams& p) {
  p.validate();
  require_f32(p.dtype, "qk_norm_rope");
  auto* qkv = static_cast<float*>(p.qkv);
  const auto* qw = static_cast<const float*>(p.q_norm_weight);
  const auto* kw = static_cast<const float*>(p.k_norm_weight);
  const int64_t heads = p.num_heads + p.num_kv_heads;  // q heads then k heads
  for (int64_t t = 0; t < p.tokens; ++t) {
    float* row = qkv + t * p.row_stride();
    for (int64_t h = 0; h < heads; ++h) {
      float* v = row + h * p.head_dim;
      if (qw != nullptr) head_rms_norm(v, h < p.num_heads ? qw : kw, p.head_dim, p.eps);
      rotate(v, p.inv_freq, p.head_dim, p.positions[t], p.cos_sin_scale);
    }
  }
  if (p.kv_append) kv_append(*p.kv_append);
}

}  // namespace lockstep::cpu
