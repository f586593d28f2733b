// Shared by the CPU ops: the CPU backend computes in float32 only.
#pragma once

#include "kernels/op_common.h"

namespace lockstep::cpu {

inline void require_f32(DType t, const char* op) {
  LS_OP_REQUIRE(t == DType::kF32, op, "the CPU backend computes in float32, got {}", dtype_name(t));
}

// Dot product with eight independent partial sums (vectorizes without
// -ffast-math and halves the rounding error growth of one running sum).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

}  // namespace lockstep::cpu
