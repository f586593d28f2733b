// out = silu(gate) * up, with each gate_up row laid out [gate (inter) | up (inter)]
// (the fused gate_up projection; under tensor parallelism `inter` is the local share).
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct SiluMulParams {
  const void* gate_up = nullptr;  // [rows, 2·inter]
  void* out = nullptr;            // [rows, inter]
  int64_t rows = 0;
  int64_t inter = 0;
  DType dtype = DType::kF32;
  void validate() const {
    LS_OP_REQUIRE(gate_up && out, "silu_mul", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && inter > 0, "silu_mul", "bad sizes rows={} inter={}", rows, inter);
  }
};

namespace cpu {
void silu_mul(const SiluMulParams& p);
}

}  // namespace lockstep
