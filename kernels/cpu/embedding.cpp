#include "kernels/embedding.h"

#include <cstring>

#include "kernels/cpu/cpu_common.h"

namespace lockstep::cpu {

void embedding(const EmbeddingParams& p) {
  p.validate();
  require_f32(p.dtype, "embedding");
  const auto* table = static_cast<const uint8_t*>(p.table);
  const int64_t row_bytes = p.hidden * static_cast<int64_t>(dtype_size(p.table_dtype));
  auto* out = static_cast<float*>(p.out);
  for (int64_t t = 0; t < p.tokens; ++t) {
    int64_t row = static_cast<int64_t>(p.ids[t]) - p.row_begin;
    float* dst = out + t * p.hidden;
    if (row >= 0 && row < p.rows_local)
      convert_to_f32(table + row * row_bytes, p.table_dtype, dst, static_cast<size_t>(p.hidden));
    else
      std::memset(dst, 0, static_cast<size_t>(p.hidden) * sizeof(float));
  }
}

}  // namespace lockstep::cpu
