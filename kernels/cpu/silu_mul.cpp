#include "kernels/silu_mul.h"

#include <cmath>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void silu_mul(const SiluMulParams& p) {
  p.validate();
  require_f32(p.dtype, "silu_mul");
  const auto* gu = static_cast<const float*>(p.gate_up);
  auto* out = static_cast<float*>(p.out);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* g = gu + r * 2 * p.inter;
    const float* u = g + p.inter;
    float* o = out + r * p.inter;
    for (int64_t i = 0; i < p.inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace lockstep::cpu
