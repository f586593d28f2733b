// Shared by the CPU ops: the CPU backend computes in float32 only.
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/op_common.h"

namespace lockstep::cpu {

// The calling thread's buffer `Use` of at least n elements, kept between
// calls: the ops' scratch is allocated once per thread, not every step.
template <typename T, int Use>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}
enum ScratchUse { kScores, kValues, kWidenedRow };

inline void require_f32(DType t, const char* op) {
  LS_OP_REQUIRE(t == DType::kF32, op, "the CPU backend computes in float32, got {}", dtype_name(t));
}

// Dot product with eight independent partial sums (vectorizes without
// -ffast-math and halves the rounding error growth of one running sum).
// `widen` gives b's elements as float32: the same sums for float32 and for
// bf16 weights widened on the fly (exactly).
template <typename B, typename Widen>
inline float dot_widened(const float* a, const B* b, int64_t n, Widen widen) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * widen(b[i + j]);
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * widen(b[i]);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

inline float dot(const float* a, const float* b, int64_t n) {
  return dot_widened(a, b, n, [](float v) { return v; });
}

inline float dot_bf16(const float* a, const uint16_t* b, int64_t n) {
  return dot_widened(a, b, n, [](uint16_t v) { return bf16_to_float(v); });
}

}  // namespace lockstep::cpu
