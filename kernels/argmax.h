// Greedy selection where the logits are: per row of this rank's share of the
// vocabulary, the largest logit among the first valid_cols columns and its
// column. NaN ranks above every number (+inf included) and the lower column
// wins ties, so a row holding a NaN picks its first NaN, and the row's best
// candidate over every split and rank is finite exactly when the row's
// logits are all below +inf, none NaN, and some above -inf (argmax_has_token).
// Only these (value, column) candidates cross to the host or between ranks,
// never the logits.
//
// A row may be cut into splits of split_cols columns, each with its own
// candidate (the GPU reads one row with many blocks); next_tokens
// (kernels/next_tokens.h) picks the best candidate of a row over its splits
// and the ranks' shares. A split with no valid column has column -1.
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/op_common.h"

namespace lockstep {

// Whether candidate (v, c) ranks before (best, best_c) by the rule above;
// the CPU twins and the kernels (argmax, next_tokens) all decide by it. (A
// NaN is the one value unequal to itself; nothing here builds with fast math.)
LS_HOST_DEVICE inline bool argmax_prefers(float v, int64_t c, float best, int64_t best_c) {
  const bool v_nan = v != v, best_nan = best != best;
  if (v_nan) return !best_nan || c < best_c;
  if (best_nan) return false;
  return v > best || (v == best && c < best_c);
}

// Whether a row whose best candidate is `best` has a token: not when a logit
// is NaN or +inf (the best is then one) or none is above -inf, which only
// weights or a config that give non-finite values produce.
LS_HOST_DEVICE inline bool argmax_has_token(float best) { return best > -INFINITY && best < INFINITY; }

struct ArgmaxParams {
  const void* logits = nullptr;  // [rows, cols]
  float* values = nullptr;       // [rows, splits()]: each split's largest logit
  int32_t* columns = nullptr;    // [rows, splits()]: its column in this rank's share, -1 for none
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t valid_cols = 0;  // columns from here on are vocabulary padding
  int64_t split_cols = 0;  // columns per split; 0: one split per row
  DType dtype = DType::kF32;
  // Splits per row: set by cols (not valid_cols), so that every rank's
  // share has as many.
  int64_t splits() const { return split_cols == 0 ? 1 : (cols + split_cols - 1) / split_cols; }
  int64_t split_width() const { return split_cols == 0 ? cols : split_cols; }
  void validate() const {
    LS_OP_REQUIRE(logits && values && columns, "argmax", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && cols > 0 && valid_cols > 0 && valid_cols <= cols && split_cols >= 0 &&
                      cols < (int64_t{1} << 31),
                  "argmax", "bad sizes rows={} cols={} valid_cols={} split_cols={}", rows, cols, valid_cols,
                  split_cols);
  }
};

namespace cpu {
void argmax(const ArgmaxParams& p);
}

}  // namespace lockstep
