#include "kernels/next_tokens.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/argmax.h"

namespace lockstep::cpu {

namespace {

// The best candidate of a row over the splits of every share (the lower
// vocabulary id on ties, argmax_prefers), as a vocabulary id.
int32_t best_candidate(const NextTokensParams& p, int64_t row) {
  const auto* words = static_cast<const uint8_t*>(p.candidates);
  const int64_t per_share = 2 * p.rows * p.splits;  // 4-byte elements
  float best = 0.0f;
  int64_t best_id = -1;
  for (int64_t s = 0; s < p.shares && s * p.share_cols < p.vocab; ++s)
    for (int64_t k = 0; k < p.splits; ++k) {
      const int64_t at = s * per_share + row * p.splits + k;
      float value;
      int32_t column;
      std::memcpy(&value, words + at * 4, 4);
      std::memcpy(&column, words + (at + p.rows * p.splits) * 4, 4);
      if (column < 0) continue;
      const int64_t id = s * p.share_cols + column;
      if (best_id < 0 || argmax_prefers(value, id, best, best_id)) best = value, best_id = id;
    }
  return best_id >= 0 && argmax_has_token(best) ? static_cast<int32_t>(best_id) : -1;
}

}  // namespace

void next_tokens(const NextTokensParams& p) {
  p.validate();
  int32_t* out = p.published + static_cast<int64_t>(*p.published_count % 2) * p.published_stride;
  for (int64_t row = 0; row < p.rows; ++row) {
    const int32_t id = p.candidates ? best_candidate(p, row) : p.sampled[row];
    out[row] = id;
    if (p.tokens == nullptr) continue;
    p.tokens[row] = std::max(id, 0);
    if (p.slots[row] != p.padding_slot) p.positions[row] = std::min(p.positions[row] + 1, p.max_position);
  }
  ++*p.published_count;
}

}  // namespace lockstep::cpu
