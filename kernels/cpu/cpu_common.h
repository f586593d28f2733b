// Shared by the CPU ops: the CPU backend computes in float32 only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/op_common.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lockstep::cpu {

// The calling thread's buffer `Use` of at least n elements, kept between
// calls: the ops' scratch is allocated once per thread, not every step.
template <typename T, int Use>
T* thread_scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}
enum ScratchUse { kScores, kExponentials, kValues, kWidenedRow };

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

// R rows of x against C rows of w: out[r * C + c] is dot(x[r], w[c], n) to
// the bit (the same eight partial sums, lanes 0-3 and 4-7 of two 4-wide
// vectors, combined in the same order), with each loaded vector used R or C
// times instead of once. Generic vectors: SSE on x86-64, NEON on Arm.
template <int R, int C>
inline void dot_tile(const float* const* x, const float* const* w, int64_t n, float* out) {
  using f32x4 = float __attribute__((vector_size(16)));
  f32x4 lo[R][C] = {}, hi[R][C] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x4 xl[R], xh[R], wl, wh;
    for (int r = 0; r < R; ++r) {
      std::memcpy(&xl[r], x[r] + i, sizeof(f32x4));
      std::memcpy(&xh[r], x[r] + i + 4, sizeof(f32x4));
    }
    for (int c = 0; c < C; ++c) {
      std::memcpy(&wl, w[c] + i, sizeof wl);
      std::memcpy(&wh, w[c] + i + 4, sizeof wh);
      for (int r = 0; r < R; ++r) lo[r][c] += xl[r] * wl, hi[r][c] += xh[r] * wh;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float tail = 0.0f;
      for (int64_t j = i; j < n; ++j) tail += x[r][j] * w[c][j];
      const f32x4 s = lo[r][c] + hi[r][c];
      out[r * C + c] = ((s[0] + s[1]) + (s[2] + s[3])) + tail;
    }
}

#if defined(__x86_64__)
// An IEEE half-precision weight's bits: the f16 element type the AVX2 and
// AVX-512 tiles read (uint16_t there means bf16).
struct F16Bits {
  uint16_t bits;
};

// A weight the tiles read, as float32 (exactly).
template <typename W>
inline float widen_weight(W v) {
  if constexpr (std::is_same_v<W, float>) return v;
  else if constexpr (std::is_same_v<W, F16Bits>) return f16_to_float(v.bits);
  else return bf16_to_float(v);
}

// dot_tile with the eight partial sums in one AVX register: the same sums,
// multiplies and adds kept apart (no FMA), so the same bits as dot_tile and
// dot; at 2 x 4, 11 of the 16 AVX registers. W: float, uint16_t for bf16
// rows or F16Bits for f16 rows, widened in registers (exactly, as dot_bf16
// and convert_to_f32 widen them; f16 by vcvtph2ps, which every AVX2 CPU has).
template <int R, int C, typename W = float>
__attribute__((target("avx2,f16c"))) void dot_tile_avx2(const float* const* x, const W* const* w, int64_t n,
                                                        float* out) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, uint16_t> || std::is_same_v<W, F16Bits>);
  using f32x8 = float __attribute__((vector_size(32)));
  using u16x8 = uint16_t __attribute__((vector_size(16)));
  using u32x8 = uint32_t __attribute__((vector_size(32)));
  f32x8 acc[R][C] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x8 xv[R], wv;
    for (int r = 0; r < R; ++r) std::memcpy(&xv[r], x[r] + i, sizeof(f32x8));
    for (int c = 0; c < C; ++c) {
      if constexpr (std::is_same_v<W, float>) {
        std::memcpy(&wv, w[c] + i, sizeof wv);
      } else {
        __m128i halves;
        std::memcpy(&halves, w[c] + i, sizeof halves);
        if constexpr (std::is_same_v<W, F16Bits>) {
          const __m256 widened = _mm256_cvtph_ps(halves);
          std::memcpy(&wv, &widened, sizeof wv);
        } else {
          u16x8 bits16;
          std::memcpy(&bits16, &halves, sizeof bits16);
          const u32x8 bits = __builtin_convertvector(bits16, u32x8) << 16;
          std::memcpy(&wv, &bits, sizeof wv);
        }
      }
      for (int r = 0; r < R; ++r) acc[r][c] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float tail = 0.0f;
      for (int64_t j = i; j < n; ++j) tail += x[r][j] * widen_weight(w[c][j]);
      const f32x8 a = acc[r][c];
      out[r * C + c] = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])) + tail;
    }
}

// dot_tile for R rows of x against 2P rows of w on AVX-512: features 2p and
// 2p + 1 share one 16-wide register, each half the eight partial sums of
// dot_tile_avx2 (x's eight values broadcast to both halves), so the same
// sums, multiplies and adds and the same bits. 32 registers hold a 4 x 8
// tile's 16 accumulators with its operands (cpu_linear_bench, one EPYC core:
// ~2x the AVX2 2 x 4 tile's rate). W: float, uint16_t for bf16 rows widened
// in registers (exactly, as dot_bf16 widens them), or F16Bits for f16 rows
// widened in registers by vcvtph2ps (exactly, as convert_to_f32 widens them).
template <int R, int P, typename W>
__attribute__((target("avx512f"))) void dot_tile_avx512(const float* const* x, const W* const* w, int64_t n,
                                                         float* out) {
  static_assert(std::is_same_v<W, float> || std::is_same_v<W, uint16_t> || std::is_same_v<W, F16Bits>);
  using f32x8 = float __attribute__((vector_size(32)));
  using f32x16 = float __attribute__((vector_size(64)));
  using u16x8 = uint16_t __attribute__((vector_size(16)));
  using u16x16 = uint16_t __attribute__((vector_size(32)));
  using u32x16 = uint32_t __attribute__((vector_size(64)));
  f32x16 acc[R][P] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x16 xv[R];
    for (int r = 0; r < R; ++r) {
      f32x8 h;
      std::memcpy(&h, x[r] + i, sizeof h);
      xv[r] = __builtin_shufflevector(h, h, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    }
    for (int p = 0; p < P; ++p) {  // elements i .. i + 7 of rows 2p and 2p + 1, as the two halves
      f32x16 wv;
      if constexpr (std::is_same_v<W, float>) {
        f32x8 lo, hi;
        std::memcpy(&lo, w[2 * p] + i, sizeof lo);
        std::memcpy(&hi, w[2 * p + 1] + i, sizeof hi);
        wv = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      } else {
        u16x8 lo, hi;
        std::memcpy(&lo, w[2 * p] + i, sizeof lo);
        std::memcpy(&hi, w[2 * p + 1] + i, sizeof hi);
        const u16x16 both = __builtin_shufflevector(lo, hi, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        if constexpr (std::is_same_v<W, F16Bits>) {
          __m256i halves;
          std::memcpy(&halves, &both, sizeof halves);
          const __m512 widened = _mm512_maskz_cvtph_ps(0xFFFF, halves);  // (the unmasked form warns in GCC 12)
          std::memcpy(&wv, &widened, sizeof wv);
        } else {
          const u32x16 bits = __builtin_convertvector(both, u32x16) << 16;
          std::memcpy(&wv, &bits, sizeof wv);
        }
      }
      for (int r = 0; r < R; ++r) acc[r][p] += xv[r] * wv;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 2 * P; ++c) {
      float tail = 0.0f;
      for (int64_t j = i; j < n; ++j) tail += x[r][j] * widen_weight(w[c][j]);
      const f32x16 a = acc[r][c / 2];
      const int h = (c % 2) * 8;
      out[r * 2 * P + c] = ((a[h] + a[h + 4]) + (a[h + 1] + a[h + 5])) + ((a[h + 2] + a[h + 6]) + (a[h + 3] + a[h + 7])) + tail;
    }
}
#endif

// The instruction sets this CPU runs (x86-64; none elsewhere), asked once.
struct CpuFeatures {
  bool avx2 = false, avx512 = false, f16c = false;
};
inline const CpuFeatures& cpu_features() {
#if defined(__x86_64__)
  static const CpuFeatures f{.avx2 = __builtin_cpu_supports("avx2") != 0,
                             .avx512 = __builtin_cpu_supports("avx512f") != 0,
                             .f16c = __builtin_cpu_supports("f16c") != 0};
#else
  static const CpuFeatures f{};
#endif
  return f;
}
inline bool has_avx2() { return cpu_features().avx2; }
inline bool has_avx512() { return cpu_features().avx512; }
inline bool has_f16c() { return cpu_features().f16c; }

// Compiles a function for AVX-512, AVX2 and the baseline, picked at load
// time (x86-64; elsewhere the one baseline build).
#if defined(__x86_64__)
#define LOCKSTEP_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define LOCKSTEP_SIMD_CLONES
#endif

// dot_tile on the widest instruction set this CPU has: the same bits on any.
template <int R, int C>
inline void dot_tile_fastest(const float* const* x, const float* const* w, int64_t n, float* out) {
#if defined(__x86_64__)
  if (has_avx2()) return dot_tile_avx2<R, C>(x, w, n, out);
#endif
  dot_tile<R, C>(x, w, n, out);
}

}  // namespace lockstep::cpu
