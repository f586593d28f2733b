#include "kernels/embedding.h"

#include <cstring>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void embedding(const EmbeddingParams& p) {
  p.validate();
  require_f32(p.dtype, "embedding");
  const auto* table = static_cast<const float*>(p.table);
  auto* out = static_cast<float*>(p.out);
  for (int64_t t = 0; t < p.tokens; ++t) {
    int64_t row = static_cast<int64_t>(p.ids[t]) - p.row_begin;
    float* dst = out + t * p.hidden;
    if (row >= 0 && row < p.rows_local)
      std::memcpy(dst, table + row * p.hidden, static_cast<size_t>(p.hidden) * sizeof(float));
    else
      std::memset(dst, 0, static_cast<size_t>(p.hidden) * sizeof(float));
  }
}

}  // namespace lockstep::cpu
