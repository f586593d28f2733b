// Greedy selection where the logits are: per row of this rank's share of the
// vocabulary, the largest logit among the first valid_cols columns and its
// column, the lowest column on ties. Only these (value, column) pairs cross
// to the host, never the logits.
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct ArgmaxParams {
  const void* logits = nullptr;  // [rows, cols]
  float* values = nullptr;       // [rows]: the largest logit
  int32_t* columns = nullptr;    // [rows]: its column in this rank's share
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t valid_cols = 0;  // columns from here on are vocabulary padding
  DType dtype = DType::kF32;
  void validate() const {
    LS_OP_REQUIRE(logits && values && columns, "argmax", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && cols > 0 && valid_cols > 0 && valid_cols <= cols, "argmax",
                  "bad sizes rows={} cols={} valid_cols={}", rows, cols, valid_cols);
  }
};

namespace cpu {
void argmax(const ArgmaxParams& p);
}

}  // namespace lockstep
