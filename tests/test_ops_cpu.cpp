// CPU ops against straightforward float64 references on odd sizes.
// Tolerance: the CPU backend computes in float32; with inputs of order one and
// reductions of at most ~1000 terms, float32 rounding stays below 1e-5 relative
// to the largest reference value, so 2e-5 leaves headroom without hiding bugs
// (a wrong index or a missing term moves results by > 1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/config.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu_threads.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace lockstep {
namespace {

constexpr double kF32Tolerance = 2e-5;

std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1e-30;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    ASSERT_LE(std::abs(got[i] - want[i]), kF32Tolerance * scale) << what << " element " << i;
  }
}

class OpSizes : public ::testing::TestWithParam<int64_t> {};

TEST_P(OpSizes, RmsNormWithAndWithoutResidual) {
  const int64_t rows = GetParam(), cols = 333;
  auto x = random_vector(rows * cols, 1), res = random_vector(rows * cols, 2), w = random_vector(cols, 3, 0.5f, 1.5f);
  const float eps = 1e-5f;
  for (bool with_residual : {false, true}) {
    std::vector<float> out(x.size(), NAN), res_out(x.size(), NAN);
    cpu::rms_norm(RmsNormParams{.x = x.data(),
                                .residual = with_residual ? res.data() : nullptr,
                                .residual_out = with_residual ? res_out.data() : nullptr,
                                .weight = w.data(),
                                .out = out.data(),
                                .rows = rows,
                                .cols = cols,
                                .eps = eps});
    std::vector<double> want(x.size()), want_sum(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      double sq = 0;
      for (int64_t c = 0; c < cols; ++c) {
        double s = x[r * cols + c] + (with_residual ? static_cast<double>(res[r * cols + c]) : 0.0);
        want_sum[r * cols + c] = s;
        sq += s * s;
      }
      double inv = 1.0 / std::sqrt(sq / cols + eps);
      for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = want_sum[r * cols + c] * inv * w[c];
    }
    expect_close(out, want, "rms_norm out");
    if (with_residual) expect_close(res_out, want_sum, "rms_norm residual");
  }
}

TEST_P(OpSizes, LinearWithBiasAndStride) {
  const int64_t rows = GetParam(), in = 131, out_f = 77, stride = 140;
  auto x = random_vector(rows * stride, 4), w = random_vector(out_f * in, 5), b = random_vector(out_f, 6);
  std::vector<float> y(rows * out_f, NAN);
  cpu::linear(LinearParams{.x = x.data(), .weight = w.data(), .bias = b.data(), .y = y.data(), .rows = rows,
                           .in_features = in, .out_features = out_f, .x_stride = stride});
  std::vector<double> want(y.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out_f; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[r * stride + i]) * w[o * in + i];
      want[r * out_f + o] = s;
    }
  expect_close(y, want, "linear");
}

// 16-bit weights (the CPU backend keeps a bf16 or f16 checkpoint's product
// weights so) give bit for bit the products of float32 weights holding the
// same values, on one thread and several.
TEST_P(OpSizes, LinearWith16BitWeightsEqualsFloat32Weights) {
  const int64_t rows = GetParam(), in = 133, out_f = 301;
  auto x = random_vector(rows * in, 8), b = random_vector(out_f, 9);
  const auto w = random_vector(out_f * in, 10);
  const int before = cpu::threads();
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> w16(w.size());
    convert_from_f32(w.data(), w16.data(), dt, w.size());
    std::vector<float> w32(w.size());  // the 16-bit values, widened
    convert_to_f32(w16.data(), dt, w32.data(), w.size());
    for (int threads : {1, 3}) {
      cpu::set_threads(threads);
      std::vector<float> from16(rows * out_f, NAN), from32(rows * out_f, NAN);
      LinearParams p{.x = x.data(), .weight = w16.data(), .bias = b.data(), .y = from16.data(), .rows = rows,
                     .in_features = in, .out_features = out_f, .weight_dtype = dt};
      cpu::linear(p);
      p.weight = w32.data(), p.y = from32.data(), p.weight_dtype = DType::kF32;
      cpu::linear(p);
      EXPECT_EQ(from16, from32) << dtype_name(dt) << " threads=" << threads;
    }
  }
  cpu::set_threads(before);
}

// The tiled products reuse each loaded vector across rows and features, but
// every output must still be the one dot product's sums in its order: equal to
// the bit to cpu::dot (what decode at batch 1 computes) on every instruction
// set, so that batching and the CPU's vector width never change a result.
TEST(DotTile, EqualsOneDotProductToTheBit) {
  for (int64_t n : {1, 7, 8, 9, 19, 133, 1000}) {
    const auto x = random_vector(4 * n, 40), w = random_vector(8 * n, 41);
    const float* xs[4] = {x.data(), x.data() + n, x.data() + 2 * n, x.data() + 3 * n};
    const float* ws[8];
    for (int c = 0; c < 8; ++c) ws[c] = w.data() + c * n;
    const auto expect_dots = [&](const float* out, int rows, int cols, const char* which) {
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c)
          EXPECT_EQ(out[r * cols + c], cpu::dot(xs[r], ws[c], n)) << which << " n=" << n << " r=" << r << " c=" << c;
    };
    float out[32];
    cpu::dot_tile<2, 4>(xs, ws, n, out);
    expect_dots(out, 2, 4, "dot_tile<2, 4>");
    cpu::dot_tile<1, 4>(xs, ws, n, out);  // attention's scores: a query against four keys
    expect_dots(out, 1, 4, "dot_tile<1, 4>");
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
      cpu::dot_tile_avx2<2, 4>(xs, ws, n, out);
      expect_dots(out, 2, 4, "dot_tile_avx2<2, 4>");
      cpu::dot_tile_avx2<1, 4>(xs, ws, n, out);
      expect_dots(out, 1, 4, "dot_tile_avx2<1, 4>");
      // 16-bit rows widened in registers: each output is cpu::dot of the row
      // widened as convert_to_f32 widens it (for bf16 that is dot_bf16).
      for (DType dt : {DType::kBF16, DType::kF16}) {
        if (dt == DType::kF16 && !__builtin_cpu_supports("f16c")) continue;
        std::vector<uint16_t> w16(w.size());
        std::vector<float> wide(w.size());
        convert_from_f32(w.data(), w16.data(), dt, w.size());
        convert_to_f32(w16.data(), dt, wide.data(), w.size());
        const uint16_t* ws16[4];
        const cpu::F16Bits* hs[4];
        for (int c = 0; c < 4; ++c) {
          ws16[c] = w16.data() + c * n;
          hs[c] = reinterpret_cast<const cpu::F16Bits*>(ws16[c]);
        }
        dt == DType::kBF16 ? cpu::dot_tile_avx2<2, 4>(xs, ws16, n, out) : cpu::dot_tile_avx2<2, 4>(xs, hs, n, out);
        for (int r = 0; r < 2; ++r)
          for (int c = 0; c < 4; ++c)
            EXPECT_EQ(out[r * 4 + c], cpu::dot(xs[r], wide.data() + c * n, n))
                << dtype_name(dt) << " AVX2 tile n=" << n << " r=" << r << " c=" << c;
      }
    } else {
      GTEST_LOG_(INFO) << "no AVX2 here: its tiles are not tested";
    }
    if (__builtin_cpu_supports("avx512f")) {
      cpu::dot_tile_avx512<4, 4>(xs, ws, n, out);  // the products' tile
      expect_dots(out, 4, 8, "dot_tile_avx512<4, 4>");
      cpu::dot_tile_avx512<1, 1>(xs, ws, n, out);
      expect_dots(out, 1, 2, "dot_tile_avx512<1, 1>");
      // bf16 rows widened in registers: each output is dot_bf16's.
      std::vector<uint16_t> w16(w.size());
      convert_from_f32(w.data(), w16.data(), DType::kBF16, w.size());
      const uint16_t* ws16[8];
      for (int c = 0; c < 8; ++c) ws16[c] = w16.data() + c * n;
      cpu::dot_tile_avx512<4, 4>(xs, ws16, n, out);
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 8; ++c)
          EXPECT_EQ(out[r * 8 + c], cpu::dot_bf16(xs[r], ws16[c], n)) << "bf16 tile n=" << n << " r=" << r << " c=" << c;
      // f16 rows widened in registers (vcvtph2ps): each output is cpu::dot
      // of the row widened by convert_to_f32, at 1 and 4 rows.
      std::vector<uint16_t> h16(w.size());
      std::vector<float> h32(w.size());
      convert_from_f32(w.data(), h16.data(), DType::kF16, w.size());
      convert_to_f32(h16.data(), DType::kF16, h32.data(), w.size());
      const cpu::F16Bits* hs[8];
      for (int c = 0; c < 8; ++c) hs[c] = reinterpret_cast<const cpu::F16Bits*>(h16.data() + c * n);
      for (int rows : {1, 4}) {
        rows == 1 ? cpu::dot_tile_avx512<1, 4>(xs, hs, n, out) : cpu::dot_tile_avx512<4, 4>(xs, hs, n, out);
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < 8; ++c)
            EXPECT_EQ(out[r * 8 + c], cpu::dot(xs[r], h32.data() + c * n, n))
                << "f16 tile n=" << n << " rows=" << rows << " r=" << r << " c=" << c;
      }
    } else {
      GTEST_LOG_(INFO) << "no AVX-512 here: its tiles are not tested";
    }
#endif
  }
}

// The product's tiles cover any number of rows and features (short tiles
// repeat a row and drop its outputs): every y equals its own dot product plus
// bias, for 16-bit weights too, with a row stride.
TEST(LinearTiles, EveryOutputIsItsOwnDotProduct) {
  const int64_t in = 37, stride = 41;
  // With AVX-512: 16-bit weights read as they are (f16 at 1-8 rows, bf16 at
  // 2-8), bf16's one row as a dot product, 9 rows widened first.
  for (int64_t rows : {1, 2, 3, 5, 9}) {
    for (int64_t out_f : {1, 2, 3, 4, 5, 9}) {
      const auto x = random_vector(rows * stride, 42), w = random_vector(out_f * in, 43), b = random_vector(out_f, 44);
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        std::vector<uint16_t> w16(w.size());
        std::vector<float> w32 = w;  // the weights' values in dt, as float32
        if (dt != DType::kF32) {
          convert_from_f32(w.data(), w16.data(), dt, w.size());
          convert_to_f32(w16.data(), dt, w32.data(), w.size());
        }
        std::vector<float> y(rows * out_f, NAN);
        cpu::linear(LinearParams{.x = x.data(), .weight = dt == DType::kF32 ? static_cast<const void*>(w.data())
                                                                            : w16.data(),
                                 .bias = b.data(), .y = y.data(), .rows = rows, .in_features = in,
                                 .out_features = out_f, .x_stride = stride, .weight_dtype = dt});
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t o = 0; o < out_f; ++o)
            ASSERT_EQ(y[r * out_f + o], cpu::dot(x.data() + r * stride, w32.data() + o * in, in) + b[o])
                << dtype_name(dt) << " rows=" << rows << " out=" << out_f << " r=" << r << " o=" << o;
      }
    }
  }
}

TEST_P(OpSizes, SiluMul) {
  const int64_t rows = GetParam(), inter = 45;
  auto gu = random_vector(rows * 2 * inter, 7, -4.0f, 4.0f);
  std::vector<float> out(rows * inter, NAN);
  cpu::silu_mul(SiluMulParams{.gate_up = gu.data(), .out = out.data(), .rows = rows, .inter = inter});
  std::vector<double> want(out.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      double g = gu[r * 2 * inter + i], u = gu[r * 2 * inter + inter + i];
      want[r * inter + i] = g / (1.0 + std::exp(-g)) * u;
    }
  expect_close(out, want, "silu_mul");
}

// The table in float32 or (the CPU backend keeps a 16-bit checkpoint's table
// so) bf16 or f16, whose rows are widened exactly.
TEST_P(OpSizes, EmbeddingVocabParallelZeroesForeignRows) {
  const int64_t tokens = GetParam(), hidden = 24, row_begin = 50, rows_local = 37;
  const auto values = random_vector(rows_local * hidden, 8);
  std::vector<int32_t> ids(tokens);
  for (int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<int32_t>((t * 13) % 120);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> table16(values.size());
    std::vector<float> table = values;  // the table's values in dt, as float32
    if (dt != DType::kF32) {
      convert_from_f32(values.data(), table16.data(), dt, values.size());
      convert_to_f32(table16.data(), dt, table.data(), values.size());
    }
    std::vector<float> out(tokens * hidden, NAN);
    cpu::embedding(EmbeddingParams{.ids = ids.data(),
                                   .table = dt == DType::kF32 ? static_cast<const void*>(table.data()) : table16.data(),
                                   .out = out.data(), .tokens = tokens, .hidden = hidden, .row_begin = row_begin,
                                   .rows_local = rows_local, .table_dtype = dt});
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t row = ids[t] - row_begin;
      for (int64_t h = 0; h < hidden; ++h)
        ASSERT_EQ(out[t * hidden + h], row >= 0 && row < rows_local ? table[row * hidden + h] : 0.0f)
            << dtype_name(dt) << " t=" << t << " h=" << h;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rows, OpSizes, ::testing::Values(1, 7, 19, 111));

struct RopeCase {
  int64_t head_dim;
  bool qk_norm;
  bool llama3;
  float cos_sin_scale = 1.0f;  // YaRN's attention factor
};

class RopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeTest, MatchesRotateHalfReference) {
  const RopeCase pc = GetParam();
  const int64_t tokens = 7, heads = 5, kv_heads = 1, hd = pc.head_dim, width = (heads + 2 * kv_heads) * hd;
  RopeConfig rope;
  rope.theta = 10000.0;
  if (pc.llama3) rope = RopeConfig{RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 64};
  auto inv = rope_inv_freq(rope, hd);
  auto qkv = random_vector(tokens * width, 9);
  auto qn = random_vector(hd, 10, 0.5f, 1.5f), kn = random_vector(hd, 11, 0.5f, 1.5f);
  std::vector<int32_t> pos = {0, 1, 5, 17, 100, 999, 4096};
  std::vector<float> got = qkv;
  const float eps = 1e-6f;
  cpu::qk_norm_rope(QkNormRopeParams{.qkv = got.data(), .positions = pos.data(), .inv_freq = inv.data(),
                                     .q_norm_weight = pc.qk_norm ? qn.data() : nullptr,
                                     .k_norm_weight = pc.qk_norm ? kn.data() : nullptr, .tokens = tokens,
                                     .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = hd, .eps = eps,
                                     .cos_sin_scale = pc.cos_sin_scale});
  std::vector<double> want(qkv.begin(), qkv.end());
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads + kv_heads; ++h) {
      double* v = &want[t * width + h * hd];
      if (pc.qk_norm) {
        double sq = 0;
        for (int64_t i = 0; i < hd; ++i) sq += v[i] * v[i];
        double r = 1.0 / std::sqrt(sq / hd + eps);
        for (int64_t i = 0; i < hd; ++i) v[i] = v[i] * r * (h < heads ? qn[i] : kn[i]);
      }
      std::vector<double> rotated(hd);
      for (int64_t i = 0; i < hd; ++i) {
        double angle = pos[t] * static_cast<double>(inv[i % (hd / 2)]);
        double partner = i < hd / 2 ? -v[i + hd / 2] : v[i - hd / 2];
        rotated[i] = pc.cos_sin_scale * (v[i] * std::cos(angle) + partner * std::sin(angle));
      }
      std::copy(rotated.begin(), rotated.end(), v);
    }
  expect_close(got, want, "qk_norm_rope");  // v (last kv_heads·hd columns) must be untouched too
}

INSTANTIATE_TEST_SUITE_P(HeadDims, RopeTest,
                         ::testing::Values(RopeCase{64, false, false}, RopeCase{128, true, false},
                                           RopeCase{64, true, true}, RopeCase{128, false, true},
                                           RopeCase{128, true, false, 1.25f}));

TEST(RopeInvFreq, Llama3ScalingMatchesTheFormula) {
  RopeConfig rope{RopeType::kLlama3, 500000.0, 8.0, 1.0, 4.0, 8192};
  auto inv = rope_inv_freq(rope, 128);
  for (int64_t i = 0; i < 64; ++i) {
    double base = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
    double wavelen = 2 * M_PI / base;
    double want = base;
    if (wavelen > 8192.0) want = base / 8.0;
    else if (wavelen >= 2048.0) {
      double s = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - s) * base / 8.0 + s * base;
    }
    EXPECT_NEAR(inv[i], want, 1e-6 * want) << i;
  }
}

// YaRN (transformers' _compute_yarn_parameters): with theta 10000, head_dim
// 128, 4096 original positions and betas 32 / 1, the correction range is
// dimensions floor(20.9) = 20 to ceil(45.0) = 46: pairs up to 20 keep their
// frequency, pairs from 46 on take frequency / factor, and pairs between
// ramp linearly (pair 33 halfway).
TEST(RopeInvFreq, YarnRampsBetweenTheCorrectionDims) {
  RopeConfig rope{.type = RopeType::kYarn, .theta = 10000.0, .factor = 4.0, .original_max_position = 4096};
  auto inv = rope_inv_freq(rope, 128);
  for (int64_t i = 0; i < 64; ++i) {
    const double base = 1.0 / std::pow(10000.0, 2.0 * i / 128.0);
    const double ramp = std::clamp((i - 20.0) / 26.0, 0.0, 1.0);
    EXPECT_NEAR(inv[i], base / 4.0 * ramp + base * (1.0 - ramp), 1e-6 * base) << i;
  }
  EXPECT_NEAR(inv[33], 0.625 * (1.0 / std::pow(10000.0, 66.0 / 128.0)), 1e-7);
  rope.truncate = false;  // the range is then the unrounded [20.94, 45.03]
  inv = rope_inv_freq(rope, 128);
  const auto dim = [](double rotations) { return 128.0 * std::log(4096.0 / (rotations * 2 * M_PI)) / (2 * std::log(10000.0)); };
  const double ramp = (45.0 - dim(32.0)) / (dim(1.0) - dim(32.0)), base = 1.0 / std::pow(10000.0, 90.0 / 128.0);
  EXPECT_NEAR(inv[45], base / 4.0 * ramp + base * (1.0 - ramp), 1e-6 * base);
}

TEST(RopeInvFreq, LinearDividesAndDynamicKeepsTheDefault) {
  const auto plain = rope_inv_freq(RopeConfig{.theta = 10000.0}, 64);
  const auto linear = rope_inv_freq(RopeConfig{.type = RopeType::kLinear, .theta = 10000.0, .factor = 4.0}, 64);
  const auto dynamic = rope_inv_freq(RopeConfig{.type = RopeType::kDynamic, .theta = 10000.0, .factor = 4.0}, 64);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_FLOAT_EQ(linear[i], plain[i] / 4.0f) << i;
    EXPECT_EQ(dynamic[i], plain[i]) << i;
  }
}

struct AttnCase {
  int64_t heads, kv_heads, head_dim;
  int64_t window = 0;  // sliding window (0: none)
};

class AttentionTest : public ::testing::TestWithParam<AttnCase> {};

// A prompt of 19 tokens in slot 1 and a decode token in slot 0 at position 6,
// in one call: causal prefill and decode are the same op. With a window, a
// token sees its own key and the window - 1 before it. Both cache layouts,
// which must give the same bits.
TEST_P(AttentionTest, CausalPrefillAndDecodeInOneBatch) {
  const AttnCase ac = GetParam();
  const int64_t width = (ac.heads + 2 * ac.kv_heads) * ac.head_dim;
  std::vector<int32_t> slots, pos;
  for (int32_t p = 0; p < 7; ++p) slots.push_back(0), pos.push_back(p);  // history of slot 0
  const int64_t history = 7;
  for (int32_t p = 0; p < 19; ++p) slots.push_back(1), pos.push_back(p);
  const int64_t tokens = static_cast<int64_t>(slots.size());
  auto qkv = random_vector(tokens * width, 12, -2.0f, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(ac.head_dim));
  const int64_t first = history - 1;
  // Append every token, then attend for all but slot 0's first six (already "past").
  const auto attend = [&](bool head_major) {
    const KvCacheShape cs{.num_slots = 2, .max_seq = 32, .num_kv_heads = ac.kv_heads, .head_dim = ac.head_dim,
                          .head_major = head_major};
    std::vector<float> k(cs.num_slots * cs.slot_stride(), NAN), v(k.size(), NAN);
    cpu::kv_append(KvAppendParams{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(), .slots = slots.data(),
                                  .positions = pos.data(), .tokens = tokens, .num_heads = ac.heads, .cache = cs});
    std::vector<float> out((tokens - first) * ac.heads * ac.head_dim, NAN);
    cpu::attention(AttentionParams{.qkv = qkv.data() + first * width, .k_cache = k.data(), .v_cache = v.data(),
                                   .slots = slots.data() + first, .positions = pos.data() + first, .out = out.data(),
                                   .tokens = tokens - first, .num_heads = ac.heads, .cache = cs, .scale = scale,
                                   .window = ac.window});
    return out;
  };
  const std::vector<float> out = attend(false);
  EXPECT_EQ(attend(true), out) << "head-major against position-major";
  std::vector<double> want(out.size());
  const int64_t group = ac.heads / ac.kv_heads;
  for (int64_t t = first; t < tokens; ++t) {
    // Keys/values of this token's sequence at positions <= its own (and
    // within the window), from qkv directly.
    std::vector<int64_t> src;
    for (int64_t j = 0; j < tokens; ++j)
      if (slots[j] == slots[t] && pos[j] <= pos[t] && (ac.window == 0 || pos[t] - pos[j] < ac.window))
        src.push_back(j);
    for (int64_t h = 0; h < ac.heads; ++h) {
      const float* q = &qkv[t * width + h * ac.head_dim];
      int64_t kvh = h / group;
      std::vector<double> s;
      double mx = -1e300;
      for (int64_t j : src) {
        const float* kk = &qkv[j * width + (ac.heads + kvh) * ac.head_dim];
        double d = 0;
        for (int64_t i = 0; i < ac.head_dim; ++i) d += static_cast<double>(q[i]) * kk[i];
        s.push_back(d * scale);
        mx = std::max(mx, s.back());
      }
      double denom = 0;
      for (double& e : s) denom += (e = std::exp(e - mx));
      for (int64_t i = 0; i < ac.head_dim; ++i) {
        double acc = 0;
        for (size_t n = 0; n < src.size(); ++n)
          acc += s[n] * qkv[src[n] * width + (ac.heads + ac.kv_heads + kvh) * ac.head_dim + i];
        want[((t - first) * ac.heads + h) * ac.head_dim + i] = acc / denom;
      }
    }
  }
  expect_close(out, want, "attention");
}

INSTANTIATE_TEST_SUITE_P(Gqa, AttentionTest,
                         ::testing::Values(AttnCase{4, 4, 64}, AttnCase{8, 2, 64}, AttnCase{5, 1, 128},
                                           AttnCase{8, 1, 128}, AttnCase{8, 2, 64, 1}, AttnCase{5, 1, 128, 5},
                                           AttnCase{4, 4, 64, 18}, AttnCase{4, 2, 64, 19}));

TEST(KvCache, OutOfRangePositionIsRefused) {
  const KvCacheShape cs{.num_slots = 1, .max_seq = 4, .num_kv_heads = 1, .head_dim = 2};
  std::vector<float> qkv(6, 1.0f), k(8), v(8);
  int32_t slot = 0, pos = 4;
  EXPECT_THROW(cpu::kv_append(KvAppendParams{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(),
                                             .slots = &slot, .positions = &pos, .tokens = 1, .num_heads = 1,
                                             .cache = cs}),
               Error);
}

TEST(KvCache, NegativeSplitCapOrWindowIsRefused) {
  const KvCacheShape cs{.num_slots = 1, .max_seq = 4, .num_kv_heads = 1, .head_dim = 2};
  std::vector<float> qkv(6, 1.0f), k(8, 0.0f), v(8, 0.0f), out(2);
  int32_t slot = 0, pos = 1;
  AttentionParams p{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(), .slots = &slot, .positions = &pos,
                    .out = out.data(), .tokens = 1, .num_heads = 1, .cache = cs, .scale = 1.0f, .max_splits = -1};
  EXPECT_THROW(cpu::attention(p), Error);
  p.max_splits = 3;  // a cap on the splits changes nothing on the CPU
  EXPECT_NO_THROW(cpu::attention(p));
  p.window = -1;
  EXPECT_THROW(cpu::attention(p), Error);
}

// cpu::linear refuses `p` once `change` has been applied to a copy of it.
template <typename Change>
void expect_refused(LinearParams p, Change change) {
  change(p);
  EXPECT_THROW(cpu::linear(p), Error);
}

// The linear op's stages: the params must describe one chain (the norm
// writes x, SiLU·mul reads y) and a fused kernel must be able to read the
// old residual while the new one is written.
TEST(LinearStages, MiswiredStagesAreRefused) {
  std::vector<float> x(8, 1.0f), res(8, 1.0f), res_out(8), nw(8, 1.0f), w(8 * 4, 0.5f), y(4), act(2), other(8);
  LinearParams p{.x = x.data(), .weight = w.data(), .y = y.data(), .rows = 1, .in_features = 8, .out_features = 4};
  p.input_norm = RmsNormParams{.x = other.data(), .residual = res.data(), .residual_out = res_out.data(),
                               .weight = nw.data(), .out = x.data(), .rows = 1, .cols = 8, .eps = 1e-6f};
  p.silu_mul = SiluMulParams{.gate_up = y.data(), .out = act.data(), .rows = 1, .inter = 2};
  EXPECT_NO_THROW(cpu::linear(p));
  expect_refused(p, [&](LinearParams& q) { q.input_norm->residual_out = res.data(); });  // aliased
  expect_refused(p, [&](LinearParams& q) { q.input_norm->out = other.data(); });  // not x
  expect_refused(p, [&](LinearParams& q) { q.silu_mul->inter = 3; });  // wrong width
}

// The q/k norm + RoPE stage must read y (the QKV rows) and be the only output stage.
TEST(LinearStages, MiswiredRopeStageIsRefused) {
  const int64_t heads = 2, kv_heads = 1, hd = 4, width = (heads + 2 * kv_heads) * hd;
  std::vector<float> x(8, 1.0f), w(width * 8, 0.5f), y(width), other(width), inv = {1.0f, 0.5f}, act(width / 2);
  std::vector<int32_t> pos = {3};
  LinearParams p{.x = x.data(), .weight = w.data(), .y = y.data(), .rows = 1, .in_features = 8, .out_features = width};
  p.qk_norm_rope = QkNormRopeParams{.qkv = y.data(), .positions = pos.data(), .inv_freq = inv.data(), .tokens = 1,
                                    .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = hd};
  EXPECT_NO_THROW(cpu::linear(p));
  expect_refused(p, [&](LinearParams& q) { q.qk_norm_rope->qkv = other.data(); });  // not y
  expect_refused(p, [&](LinearParams& q) { q.qk_norm_rope->num_heads = 3; });      // another width
  expect_refused(p, [&](LinearParams& q) {                                          // two output stages
    q.silu_mul = SiluMulParams{.gate_up = y.data(), .out = act.data(), .rows = 1, .inter = width / 2};
  });
}

// Stages on the CPU are the ops themselves, in order.
TEST(LinearStages, SameAsTheOpsInSequence) {
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto fill = [&](size_t n) { std::vector<float> v(n); for (float& e : v) e = d(rng); return v; };
  const int64_t rows = 3, in = 10, inter = 6;
  std::vector<float> x = fill(rows * in), res = fill(rows * in), nw = fill(in), w = fill(2 * inter * in);
  std::vector<float> res_out(x.size()), normed(x.size()), y(rows * 2 * inter), act(rows * inter);
  const RmsNormParams norm{.x = x.data(), .residual = res.data(), .residual_out = res_out.data(), .weight = nw.data(),
                           .out = normed.data(), .rows = rows, .cols = in, .eps = 1e-5f};
  const SiluMulParams silu{.gate_up = y.data(), .out = act.data(), .rows = rows, .inter = inter};
  cpu::linear(LinearParams{.x = normed.data(), .weight = w.data(), .y = y.data(), .rows = rows, .in_features = in,
                           .out_features = 2 * inter, .input_norm = norm, .silu_mul = silu});
  std::vector<float> want_res(x.size()), want_normed(x.size()), want_y(y.size()), want_act(act.size());
  RmsNormParams n2 = norm;
  n2.residual_out = want_res.data(), n2.out = want_normed.data();
  cpu::rms_norm(n2);
  cpu::linear(LinearParams{.x = want_normed.data(), .weight = w.data(), .y = want_y.data(), .rows = rows,
                           .in_features = in, .out_features = 2 * inter});
  cpu::silu_mul(SiluMulParams{.gate_up = want_y.data(), .out = want_act.data(), .rows = rows, .inter = inter});
  EXPECT_EQ(res_out, want_res);
  EXPECT_EQ(act, want_act);
}

// input_rms with the norm weight folded into W (W[o, i] · g[i]) is the
// product of the normed rows: against rms_norm then the product with W, in
// float64, with and without a bias and at one row and several; the SiLU·mul
// stage then reads the scaled rows. residual adds a row to each output row.
TEST(LinearStages, FoldedInputNormAndResidualMatchTheUnfoldedOps) {
  std::mt19937 rng(12);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto fill = [&](size_t n, float scale) { std::vector<float> v(n); for (float& e : v) e = scale * d(rng); return v; };
  const int64_t in = 37, inter = 5;
  const float eps = 1e-5f;
  for (int64_t rows : {1, 4})
    for (bool bias : {false, true}) {
      std::vector<float> x = fill(rows * in, 3.0f), g = fill(in, 1.0f), w = fill(2 * inter * in, 0.2f);
      std::vector<float> b = fill(2 * inter, 1.0f), folded(w.size()), y(rows * 2 * inter), act(rows * inter);
      for (int64_t o = 0; o < 2 * inter; ++o)
        for (int64_t i = 0; i < in; ++i) folded[o * in + i] = w[o * in + i] * g[i];
      LinearParams p{.x = x.data(), .weight = folded.data(), .bias = bias ? b.data() : nullptr, .y = y.data(),
                     .rows = rows, .in_features = in, .out_features = 2 * inter,
                     .silu_mul = SiluMulParams{.gate_up = y.data(), .out = act.data(), .rows = rows, .inter = inter},
                     .input_rms = InputRms{.eps = eps}};
      cpu::linear(p);
      std::vector<double> want_y(y.size()), want_act(act.size());
      for (int64_t r = 0; r < rows; ++r) {
        double sq = 0.0;
        for (int64_t i = 0; i < in; ++i) sq += static_cast<double>(x[r * in + i]) * x[r * in + i];
        const double inv = 1.0 / std::sqrt(sq / in + eps);
        for (int64_t o = 0; o < 2 * inter; ++o) {
          double s = bias ? b[o] : 0.0;
          for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * inv * g[i] * static_cast<double>(w[o * in + i]);
          want_y[r * 2 * inter + o] = s;
        }
        for (int64_t o = 0; o < inter; ++o) {
          const double gate = want_y[r * 2 * inter + o], up = want_y[r * 2 * inter + inter + o];
          want_act[r * inter + o] = gate / (1.0 + std::exp(-gate)) * up;
        }
      }
      expect_close(y, want_y, "folded input norm: y");
      expect_close(act, want_act, "folded input norm: silu_mul");
      // The residual add (o_proj and down): y = x·Wᵀ + bias + residual.
      std::vector<float> res = fill(rows * 2 * inter, 4.0f), y2(y.size());
      cpu::linear(LinearParams{.x = x.data(), .weight = w.data(), .bias = bias ? b.data() : nullptr, .y = y2.data(),
                               .rows = rows, .in_features = in, .out_features = 2 * inter, .residual = res.data()});
      std::vector<double> want_y2(y2.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < 2 * inter; ++o) {
          double s = (bias ? b[o] : 0.0) + res[r * 2 * inter + o];
          for (int64_t i = 0; i < in; ++i) s += static_cast<double>(x[r * in + i]) * w[o * in + i];
          want_y2[r * 2 * inter + o] = s;
        }
      expect_close(y2, want_y2, "residual");
    }
}

// input_rms needs an output stage to read the scaled rows and rules out an
// input norm; its scratch and the residual may not alias x or y.
TEST(LinearStages, MiswiredFoldedNormAndResidualAreRefused) {
  std::vector<float> x(8, 1.0f), w(8 * 4, 0.5f), y(4), act(2), res(4, 1.0f), nw(8, 1.0f), normed(8);
  LinearParams p{.x = x.data(), .weight = w.data(), .y = y.data(), .rows = 1, .in_features = 8, .out_features = 4,
                 .silu_mul = SiluMulParams{.gate_up = y.data(), .out = act.data(), .rows = 1, .inter = 2},
                 .input_rms = InputRms{.eps = 1e-6f}};
  EXPECT_NO_THROW(cpu::linear(p));
  expect_refused(p, [&](LinearParams& q) { q.silu_mul.reset(); });          // no stage reads the rows
  expect_refused(p, [&](LinearParams& q) { q.input_rms->eps = 0.0f; });     // no epsilon
  expect_refused(p, [&](LinearParams& q) { q.x_stride = 9; });              // rows not contiguous
  expect_refused(p, [&](LinearParams& q) { q.input_rms->normed = q.y; });   // scratch on the output
  expect_refused(p, [&](LinearParams& q) { q.input_rms->normed = x.data(); });  // or on the input
  expect_refused(p, [&](LinearParams& q) {                                  // and an input norm
    q.x = normed.data();
    q.input_norm = RmsNormParams{.x = x.data(), .weight = nw.data(), .out = normed.data(), .rows = 1, .cols = 8,
                                 .eps = 1e-6f};
  });
  LinearParams r{.x = x.data(), .weight = w.data(), .y = y.data(), .rows = 1, .in_features = 8, .out_features = 4,
                 .residual = res.data()};
  EXPECT_NO_THROW(cpu::linear(r));
  expect_refused(r, [&](LinearParams& q) { q.residual = y.data(); });  // aliases y
  expect_refused(r, [&](LinearParams& q) {                             // y is not the product's output
    q.silu_mul = SiluMulParams{.gate_up = y.data(), .out = act.data(), .rows = 1, .inter = 2};
  });
}

// The CPU ops split their outputs over threads; every output is computed as
// with one thread, so the results are identical to the bit.
TEST(CpuThreads, ResultsDoNotDependOnTheCount) {
  const int before = cpu::threads();
  const int64_t rows = 5, in = 300, out = 517;
  auto x = random_vector(rows * in, 31), w = random_vector(out * in, 32), b = random_vector(out, 33);
  const KvCacheShape cs{.num_slots = 1, .max_seq = 64, .num_kv_heads = 2, .head_dim = 16};
  const int64_t heads = 6, tokens = 40, width = (heads + 2 * cs.num_kv_heads) * cs.head_dim;
  auto qkv = random_vector(tokens * width, 34, -2.0f, 2.0f);
  std::vector<int32_t> slots(tokens, 0), pos(tokens);
  for (int32_t t = 0; t < tokens; ++t) pos[static_cast<size_t>(t)] = t;
  std::vector<float> k(cs.slot_stride()), v(k.size());
  cpu::kv_append(KvAppendParams{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(), .slots = slots.data(),
                                .positions = pos.data(), .tokens = tokens, .num_heads = heads, .cache = cs});
  const auto run = [&](int threads) {
    cpu::set_threads(threads);
    std::vector<float> y(rows * out), attn(tokens * heads * cs.head_dim);
    cpu::linear(LinearParams{.x = x.data(), .weight = w.data(), .bias = b.data(), .y = y.data(), .rows = rows,
                             .in_features = in, .out_features = out});
    cpu::attention(AttentionParams{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(), .slots = slots.data(),
                                   .positions = pos.data(), .out = attn.data(), .tokens = tokens, .num_heads = heads,
                                   .cache = cs, .scale = 0.25f});
    y.insert(y.end(), attn.begin(), attn.end());
    // One decode token: with more threads than (token, kv head) pairs a GQA
    // group is split into smaller chunks of heads, each head unchanged.
    std::vector<float> decode(heads * cs.head_dim);
    cpu::attention(AttentionParams{.qkv = qkv.data() + (tokens - 1) * width, .k_cache = k.data(),
                                   .v_cache = v.data(), .slots = slots.data(), .positions = pos.data() + tokens - 1,
                                   .out = decode.data(), .tokens = 1, .num_heads = heads, .cache = cs,
                                   .scale = 0.25f});
    y.insert(y.end(), decode.begin(), decode.end());
    return y;
  };
  const std::vector<float> one = run(1);
  EXPECT_EQ(cpu::threads(), 1);
  for (int threads : {2, 3, 8}) EXPECT_EQ(run(threads), one) << threads << " threads";
  cpu::set_threads(before);
  EXPECT_THROW(cpu::set_threads(0), Error);
}

}  // namespace
}  // namespace lockstep
