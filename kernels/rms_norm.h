// RMSNorm, optionally fused with the residual add:
//   sum = x (+ residual);  residual_out = sum;  out = sum / rms(sum) * weight
// (a null weight is all ones: the scale alone, for a norm whose weight is
// folded into the product after it, LinearParams::input_rms)
// residual_out may alias residual (the engine keeps the residual stream in
// place); out must not alias x.
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct RmsNormParams {
  const void* x = nullptr;         // [rows, cols]
  const void* residual = nullptr;  // [rows, cols] or null: no add
  void* residual_out = nullptr;    // [rows, cols]; required when residual is set
  const void* weight = nullptr;    // [cols] or null (ones)
  void* out = nullptr;             // [rows, cols]
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 0.0f;                // from the model's config, never a constant
  DType dtype = DType::kF32;       // of x, residual, out and weight
  void validate() const {
    LS_OP_REQUIRE(x && out, "rms_norm", "null pointer");
    LS_OP_REQUIRE(!residual || residual_out, "rms_norm", "residual without residual_out");
    LS_OP_REQUIRE(rows >= 0 && cols > 0, "rms_norm", "bad sizes rows={} cols={}", rows, cols);
    LS_OP_REQUIRE(eps > 0.0f, "rms_norm", "eps must be positive, got {}", eps);
  }
};

namespace cpu {
void rms_norm(const RmsNormParams& p);
}

}  // namespace lockstep
