#include "kernels/linear.h"

#include "kernels/cpu/cpu_common.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace lockstep::cpu {

// Loops over output features outermost so each weight row is read from memory
// once and reused from cache for every input row; the features are split over
// the CPU threads (kernels/cpu_threads.h) when the product is large enough to
// pay for them. 16-bit weights are widened to float32 (exact: the same
// products as float32 weights of the same values, with half the bytes to
// read): bf16 inside the dot product at 1-2 rows (one pass over the weights;
// measured 1.3x faster than widening the row first at batch 1, slower at 4),
// else a row at a time into a buffer that every input row reuses. The
// optional stages run as their own ops, before and after.
void linear(const LinearParams& p) {
  p.validate();
  if (p.input_norm) rms_norm(*p.input_norm);
  require_f32(p.act_dtype, "linear");
  const auto* x = static_cast<const float*>(p.x);
  const auto* w = static_cast<const uint8_t*>(p.weight);
  const auto* bias = static_cast<const float*>(p.bias);
  auto* y = static_cast<float*>(p.y);
  const int64_t xs = p.x_row_stride();
  const int64_t row_bytes = p.in_features * static_cast<int64_t>(dtype_size(p.weight_dtype));
  // bf16 at 1-2 rows widens inside the dot; other 16-bit products widen each row into scratch.
  const bool dot_widens = p.weight_dtype == DType::kBF16 && p.rows <= 2;
  const bool row_widens = p.weight_dtype != DType::kF32 && !dot_widens;
  [[maybe_unused]] const bool parallel = p.out_features * p.in_features * p.rows >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    float* widened = row_widens ? thread_scratch<float, kWidenedRow>(static_cast<size_t>(p.in_features)) : nullptr;
#pragma omp for schedule(static)
    for (int64_t o = 0; o < p.out_features; ++o) {
      const uint8_t* stored = w + o * row_bytes;
      const float b = bias != nullptr ? bias[o] : 0.0f;
      float* out = y + o;
      if (dot_widens) {
        const auto* wr = reinterpret_cast<const uint16_t*>(stored);
        for (int64_t r = 0; r < p.rows; ++r) out[r * p.out_features] = dot_bf16(x + r * xs, wr, p.in_features) + b;
        continue;
      }
      const float* wr = reinterpret_cast<const float*>(stored);
      if (row_widens) {
        convert_to_f32(stored, p.weight_dtype, widened, static_cast<size_t>(p.in_features));
        wr = widened;
      }
      for (int64_t r = 0; r < p.rows; ++r) out[r * p.out_features] = dot(x + r * xs, wr, p.in_features) + b;
    }
  }
  if (p.silu_mul) silu_mul(*p.silu_mul);
  if (p.qk_norm_rope) qk_norm_rope(*p.qk_norm_rope);
}

}  // namespace lockstep::cpu
