// The arithmetic of the sampling rule (kernels/sampling.h) that the CPU twin
// and the CUDA kernel share, written so that both give bit-identical
// results: integer arithmetic, plus IEEE double subtraction and division
// (correctly rounded on every compliant host and GPU, and with no multiply
// for a compiler to contract into an fma). No exp() from a math library.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#define LS_HOST_DEVICE __host__ __device__
#else
#define LS_HOST_DEVICE
#endif

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
// key(a) < key(b) (with -0 just below +0). NaN ranks as -inf.
LS_HOST_DEVICE inline uint32_t order_key(float v) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(v);
#else
  std::memcpy(&bits, &v, sizeof bits);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) bits = 0xff800000u;  // NaN -> -inf
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
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

// floor(2^62 · exp(-a / 2^62)) for a in [0, ln 2 · 2^62), up to a few units
// in the last place: Horner's scheme of the Taylor series (the 14th term is
// below 2^-40), in Q62 fixed point with exact integer steps only. The
// divisors are constants after unrolling, so the GPU multiplies instead of
// dividing; the results are the same integers either way.
LS_HOST_DEVICE inline uint64_t exp_neg_q62(uint64_t a) {
  constexpr uint64_t kOne = uint64_t{1} << 62;
  uint64_t e = kOne;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
  for (uint64_t j = 13; j >= 1; --j) {
    const uint64_t ae = (mul_hi(a, e) << 2) | ((a * e) >> 62);  // a·e / 2^62, both below 2^62
    e = kOne - ae / j;
  }
  return e;
}

// The integer weight of a logit: floor(2^32 · exp((logit - max_logit) /
// temperature)) to within about 1e-11 relative (0 below 2^-32 relative, so
// a row of up to 2^31 columns sums to less than 2^63). A logit equal to the
// maximum weighs exactly 2^32, also when the maximum is infinite.
LS_HOST_DEVICE inline uint64_t weight(float logit, float max_logit, float temperature) {
  if (logit == max_logit) return kWeightOne;
  const double x = (static_cast<double>(max_logit) - static_cast<double>(logit)) / static_cast<double>(temperature);
  if (!(x < 23.0)) return 0;  // exp(-23) < 2^-32; also an infinite difference
  constexpr uint64_t kLn2Q40 = 762123384786ull;  // round(ln 2 · 2^40)
  const uint64_t t = static_cast<uint64_t>(x * 0x1p40);  // x in Q40 (scaling by 2^40 is exact), truncated
  const uint64_t halvings = t / kLn2Q40;                 // exp(-x) = 2^-halvings · exp(-rest)
  const uint64_t rest = t - halvings * kLn2Q40;
  return exp_neg_q62(rest << 22) >> (62 - kWeightBits + halvings);
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
