#include "kernels/rms_norm.h"

#include <cmath>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void rms_norm(const RmsNormParams& p) {
  p.validate();
  require_f32(p.dtype, "rms_norm");
  const auto* x = static_cast<const float*>(p.x);
  const auto* residual = static_cast<const float*>(p.residual);
  auto* residual_out = static_cast<float*>(p.residual_out);
  const auto* w = static_cast<const float*>(p.weight);
  auto* out = static_cast<float*>(p.out);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* xr = x + r * p.cols;
    const float* src = xr;
    if (residual != nullptr) {
      float* sum = residual_out + r * p.cols;
      const float* res = residual + r * p.cols;
      for (int64_t c = 0; c < p.cols; ++c) sum[c] = xr[c] + res[c];
      src = sum;
    }
    double sq = 0.0;
    for (int64_t c = 0; c < p.cols; ++c) sq += static_cast<double>(src[c]) * src[c];
    float inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(p.cols) + p.eps));
    float* o = out + r * p.cols;
    for (int64_t c = 0; c < p.cols; ++c) o[c] = src[c] * inv * (w != nullptr ? w[c] : 1.0f);
  }
}

}  // namespace lockstep::cpu
