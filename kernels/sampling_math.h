// The arithmetic of the sampling rule (kernels/sampling.h) that the CPU twin
// and the CUDA kernel share, written so that both give bit-identical
// results: integer arithmetic and correctly rounded IEEE double steps, with
// every multiply-add written as an explicit fused multiply-add (so that no
// compiler contracts, or declines to contract, one of its own). No exp() from
// a math library.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace lockstep::sampling {

// A weight of 2^32 is probability one relative to the row's largest logit.
inline constexpr int kWeightBits = 32;
inline constexpr uint64_t kWeightOne = uint64_t{1} << kWeightBits;

// High 64 bits of the 128-bit product a·b.
LS_HOST_DEVICE inline uint64_t mul_hi(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

// An order-preserving unsigned key of a float: a < b as floats iff
// key(a) < key(b) (with -0 just below +0). NaN ranks above +inf, so that a
// row holding one leads its order with it (and has no token).
LS_HOST_DEVICE inline uint32_t order_key(float v) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(v);
#else
  std::memcpy(&bits, &v, sizeof bits);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Whether a row whose largest key is `largest_key` has a token: its largest
// logit is finite, so no logit is NaN or +inf and one is above -inf (other
// rows come only from weights or a config that give non-finite values).
LS_HOST_DEVICE inline bool has_token(uint32_t largest_key) {
  return largest_key > order_key(-INFINITY) && largest_key < order_key(INFINITY);
}

// The float whose order_key is `key`.
LS_HOST_DEVICE inline float key_value(uint32_t key) {
  const uint32_t bits = (key & 0x80000000u) != 0 ? key & 0x7fffffffu : ~key;
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
#endif
}

// a · b + c, rounded once (IEEE fused multiply-add): the same double on the
// host and the GPU, where a separate multiply and add could be contracted
// on one and not the other.
LS_HOST_DEVICE inline double fused_multiply_add(double a, double b, double c) {
#ifdef __CUDA_ARCH__
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// exp(-r) for r in [0, ln 2] (and a few units in the last place either
// side): Horner's scheme of the Taylor series through r^13 (the next term is
// below 2^-44), coefficients (-1)^k / k! as exact hexadecimal doubles, every
// step one fused multiply-add.
LS_HOST_DEVICE inline double exp_neg_reduced(double r) {
  double e = -0x1.6124613a86d09p-33;
  e = fused_multiply_add(e, r, 0x1.1eed8eff8d898p-29);
  e = fused_multiply_add(e, r, -0x1.ae64567f544e4p-26);
  e = fused_multiply_add(e, r, 0x1.27e4fb7789f5cp-22);
  e = fused_multiply_add(e, r, -0x1.71de3a556c734p-19);
  e = fused_multiply_add(e, r, 0x1.a01a01a01a01ap-16);
  e = fused_multiply_add(e, r, -0x1.a01a01a01a01ap-13);
  e = fused_multiply_add(e, r, 0x1.6c16c16c16c17p-10);
  e = fused_multiply_add(e, r, -0x1.1111111111111p-7);
  e = fused_multiply_add(e, r, 0x1.5555555555555p-5);
  e = fused_multiply_add(e, r, -0x1.5555555555555p-3);
  e = fused_multiply_add(e, r, 0x1.0p-1);
  e = fused_multiply_add(e, r, -0x1.0p+0);
  return fused_multiply_add(e, r, 0x1.0p+0);
}

// 1 / temperature, the factor weight() takes (temperature > 0).
LS_HOST_DEVICE inline double inverse_temperature(float temperature) { return 1.0 / static_cast<double>(temperature); }

// The integer weight of a logit: floor(2^32 · exp((logit - max_logit) ·
// inv_temperature)) to within about 1e-14 relative (0 below 2^-32 relative,
// so a row of up to 2^31 columns sums to less than 2^63). A logit equal to
// the maximum weighs exactly 2^32, also when the maximum is infinite. Only
// correctly rounded IEEE double steps (subtract, multiply, floor, fused
// multiply-add, power-of-two scaling, truncation), so the host and the GPU
// get the same integer.
LS_HOST_DEVICE inline uint64_t weight(float logit, float max_logit, double inv_temperature) {
  if (logit == max_logit) return kWeightOne;
  const double x = (static_cast<double>(max_logit) - static_cast<double>(logit)) * inv_temperature;
  if (!(x < 23.0)) return 0;  // exp(-23) < 2^-32; also an infinite difference
  constexpr double kLn2 = 0x1.62e42fefa39efp-1, kInvLn2 = 0x1.71547652b82fep+0;
  const double halvings = floor(x * kInvLn2);                   // exp(-x) = 2^-halvings · exp(-rest); 0..33
  const double rest = fused_multiply_add(-halvings, kLn2, x);  // in [0, ln 2] up to rounding
  const double scaled = ldexp(exp_neg_reduced(rest), kWeightBits - static_cast<int>(halvings));
  return scaled >= static_cast<double>(kWeightOne) ? kWeightOne : static_cast<uint64_t>(scaled);
}

// The nucleus mass for top_p in (0, 1]: ceil(total · p32 / 2^32) with p32 =
// ceil(top_p · 2^32) (exact: top_p · 2^32 is a power-of-two scaling).
LS_HOST_DEVICE inline uint64_t nucleus_mass(uint64_t total, float top_p) {
  const double scaled = static_cast<double>(top_p) * 0x1p32;
  uint64_t p32 = static_cast<uint64_t>(scaled);
  if (static_cast<double>(p32) < scaled || p32 == 0) ++p32;
  const uint64_t hi = mul_hi(total, p32), lo = total * p32;
  return ((hi << 32) | (lo >> 32)) + ((lo & 0xffffffffu) != 0 ? 1 : 0);
}

// The draw: a value in [0, mass) from 64 random bits (multiply-high; the
// bias is below mass / 2^64).
LS_HOST_DEVICE inline uint64_t draw(uint64_t random, uint64_t mass) { return mul_hi(random, mass); }

// Where column `col` of row `row` is in logits laid out as [shards][rows][cols]
// (the all-gathered vocabulary shards of tensor parallelism; shards = 1 is a
// plain [rows, cols] matrix).
LS_HOST_DEVICE inline int64_t logit_index(int64_t row, int64_t col, int64_t rows, int64_t cols, int64_t shards) {
  const int64_t shard = shards == 1 ? 0 : col / cols;
  return (shard * rows + row) * cols + (col - shard * cols);
}

}  // namespace lockstep::sampling
