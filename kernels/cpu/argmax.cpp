#include "kernels/argmax.h"

#include <algorithm>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void argmax(const ArgmaxParams& p) {
  p.validate();
  require_f32(p.dtype, "argmax");
  const auto* logits = static_cast<const float*>(p.logits);
  const int64_t splits = p.splits();
  const int64_t width = p.split_width();
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* row = logits + r * p.cols;
    for (int64_t s = 0; s < splits; ++s) {
      const int64_t begin = s * width;
      const int64_t end = std::min(begin + width, p.valid_cols);
      int64_t best = begin < end ? begin : -1;
      for (int64_t c = begin + 1; c < end; ++c)
        if (argmax_prefers(row[c], c, row[best], best)) best = c;
      p.values[r * splits + s] = best < 0 ? 0.0f : row[best];
      p.columns[r * splits + s] = static_cast<int32_t>(best);
    }
  }
}

}  // namespace lockstep::cpu
