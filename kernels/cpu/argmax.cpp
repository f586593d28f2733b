#include "kernels/argmax.h"

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void argmax(const ArgmaxParams& p) {
  p.validate();
  require_f32(p.dtype, "argmax");
  const auto* logits = static_cast<const float*>(p.logits);
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* row = logits + r * p.cols;
    int64_t best = 0;
    for (int64_t c = 1; c < p.valid_cols; ++c)
      if (row[c] > row[best]) best = c;
    p.values[r] = row[best];
    p.columns[r] = static_cast<int32_t>(best);
  }
}

}  // namespace lockstep::cpu
