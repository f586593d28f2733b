#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/dtype.h"

namespace lockstep {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // Just above halfway rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

// Every one of the 65536 f16 bit patterns against the format's definition:
// (-1)^s * 2^(e-15) * (1 + m/1024), subnormals m * 2^-24, signed zeros, and
// for e = 31 infinity or a quiet NaN whose payload is kept.
TEST(DType, F16ToFloatIsExactForEveryBitPattern) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const uint32_t sign = h >> 15, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    const float got = f16_to_float(static_cast<uint16_t>(h));
    uint32_t got_bits;
    std::memcpy(&got_bits, &got, 4);
    ASSERT_EQ(got_bits >> 31, sign) << "h=" << h;
    if (exp == 31) {
      ASSERT_EQ(got_bits & 0x7fffffffu, 0x7f800000u | mant << 13 | (mant != 0 ? 0x400000u : 0u)) << "h=" << h;
      continue;
    }
    const double magnitude = exp == 0 ? std::ldexp(static_cast<double>(mant), -24)
                                      : std::ldexp(1.0 + mant / 1024.0, static_cast<int>(exp) - 15);
    ASSERT_EQ(static_cast<double>(std::fabs(got)), magnitude) << "h=" << h;
  }
}

// convert_to_f32 (F16C eight at a time where the CPU has it, then one at a
// time) gives f16_to_float's bits for every pattern, NaN payloads included.
TEST(DType, F16ArrayConversionEqualsTheScalarOne) {
  std::vector<uint16_t> all(0x10001u);  // an odd length: the vector loop and its tail
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);
  std::vector<float> got(all.size());
  convert_to_f32(all.data(), DType::kF16, got.data(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = f16_to_float(all[i]);
    ASSERT_EQ(std::memcmp(&got[i], &want, 4), 0) << "h=" << all[i];
  }
}

TEST(DType, F16RoundTripNormalsSubnormalsAndOverflow) {
  // Every finite f16 value survives f16 -> f32 -> f16.
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7c00u) == 0x7c00u) continue;  // inf / NaN handled below
    ASSERT_EQ(float_to_f16(f16_to_float(v)), v) << "h=" << h;
  }
  EXPECT_EQ(f16_to_float(0x3c00u), 1.0f);
  EXPECT_EQ(f16_to_float(0x0001u), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(float_to_f16(70000.0f), 0x7c00u);                // overflow to inf
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -26)), 0u);        // underflow to zero
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00u)));
}

TEST(DType, ParseNames) {
  EXPECT_EQ(parse_dtype_name("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype_name("float16"), DType::kF16);
  EXPECT_EQ(parse_dtype_name("float32"), DType::kF32);
  EXPECT_THROW(parse_dtype_name("int8"), std::exception);
  DType t;
  EXPECT_TRUE(parse_safetensors_dtype("BF16", &t));
  EXPECT_FALSE(parse_safetensors_dtype("I8", &t));
}

}  // namespace
}  // namespace lockstep
