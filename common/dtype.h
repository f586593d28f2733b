// Element types of checkpoints and device tensors, and their conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace lockstep {

enum class DType { kF32, kF16, kBF16 };

inline size_t dtype_size(DType t) { return t == DType::kF32 ? 4 : 2; }
const char* dtype_name(DType t);                         // "float32", "float16", "bfloat16"
const char* dtype_safetensors_name(DType t);             // "F32", "F16", "BF16"
bool parse_safetensors_dtype(std::string_view s, DType* out);
// Accepts torch/HF spellings: float32/float/fp32/f32, float16/half/fp16/f16,
// bfloat16/bf16. Throws kInvalidArgument naming the value otherwise.
DType parse_dtype_name(std::string_view s);

inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Exact, without branches (loops over it vectorize): a subnormal's mantissa
// is converted as an integer and scaled by 2^-24, so no subnormal float is
// involved and the FPU's denormal modes cannot change the result; exponent
// 31 (infinity, NaN) becomes float's 255 (31 + 112 + 112), and a NaN comes
// out quiet with its payload, as the F16C instruction converts it.
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  const uint32_t quiet = static_cast<uint32_t>(exp == 31u && mant != 0u) << 22;
  const uint32_t normal_bits = (exp + 112u + 112u * (exp == 31u)) << 23 | mant << 13 | quiet;
  const float subnormal = static_cast<float>(static_cast<int32_t>(mant)) * 0x1p-24f;
  uint32_t subnormal_bits;
  std::memcpy(&subnormal_bits, &subnormal, 4);
  const uint32_t is_subnormal = 0u - static_cast<uint32_t>(exp == 0u);
  const uint32_t bits = sign | (normal_bits & ~is_subnormal) | (subnormal_bits & is_subnormal);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t float_to_f16(float f);

// Converts n elements of type `src_type` at `src` to float32.
void convert_to_f32(const void* src, DType src_type, float* dst, size_t n);
// Converts n float32 values to `dst_type` at `dst`.
void convert_from_f32(const float* src, void* dst, DType dst_type, size_t n);

}  // namespace lockstep
