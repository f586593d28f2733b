// The sampling op's CPU twin (kernels/sampling.h): greedy cases, the exact
// draw, the distribution it samples, what top-k and top-p exclude, the
// shard layout, and refused settings. Every test is deterministic (fixed
// seeds); the chi-square bounds are the 0.1% upper quantiles, so a correct
// sampler fails a given seed with probability 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "kernels/argmax.h"
#include "kernels/sampling.h"
#include "kernels/sampling_math.h"
#include "test_support.h"

namespace lockstep {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Samples one row of `logits` with `row` settings, drawing `random`.
int32_t sample_one(const std::vector<float>& logits, SampleRow row, int64_t valid_cols = 0) {
  int32_t id = -1;
  cpu::sample(SampleParams{.logits = logits.data(), .settings = &row, .ids = &id, .rows = 1,
                           .cols = static_cast<int64_t>(logits.size()),
                           .valid_cols = valid_cols > 0 ? valid_cols : static_cast<int64_t>(logits.size())});
  return id;
}

// Counts of each token over `draws` draws with random bits from (seed, step).
std::vector<int64_t> counts(const std::vector<float>& logits, SampleRow row, int draws, uint64_t seed) {
  std::vector<int64_t> n(logits.size(), 0);
  for (int i = 0; i < draws; ++i) {
    row.random = sampling_random(seed, 0, static_cast<uint64_t>(i));
    ++n[static_cast<size_t>(sample_one(logits, row))];
  }
  return n;
}

// softmax(logits / temperature) over the first `keep` entries (the rest 0).
std::vector<double> softmax(const std::vector<float>& logits, double temperature, size_t keep) {
  std::vector<double> p(logits.size(), 0.0);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp((logits[i] - logits[0]) / temperature);
  for (double& x : p) x /= total;
  return p;
}

double chi_square(const std::vector<int64_t>& got, const std::vector<double>& p, int draws) {
  double chi2 = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0.0) {
      EXPECT_EQ(got[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    const double expected = p[i] * draws;
    chi2 += (got[i] - expected) * (got[i] - expected) / expected;
  }
  return chi2;
}

// Sorted descending, so that the kept prefixes are the first columns.
const std::vector<float> kLogits = {2.0f, 1.5f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f};

TEST(SampleOp, WeightsFollowExp) {
  for (double d = 0.0; d < 23.0; d += 0.0137) {
    const float x = static_cast<float>(-d);
    const double want = std::ldexp(std::exp(static_cast<double>(x)), sampling::kWeightBits);
    const auto got = static_cast<double>(sampling::weight(x, 0.0f, 1.0f));
    // Truncation to an integer (1) plus the series' and the rounding steps' error (below 1e-14 relative).
    EXPECT_LE(std::abs(got - want), 1.0 + 1e-14 * want) << "x=" << x;
  }
  EXPECT_EQ(sampling::weight(1.0f, 1.0f, sampling::inverse_temperature(1e-30f)), sampling::kWeightOne);
  EXPECT_EQ(sampling::weight(-kInf, 0.0f, 1.0f), 0u);
  EXPECT_EQ(sampling::weight(0.0f, kInf, 1.0f), 0u);
  EXPECT_EQ(sampling::weight(-1.0f, 0.0f, sampling::inverse_temperature(1e-30f)), 0u);
}

TEST(SampleOp, TemperatureZeroAndTopKOneAreArgmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(1 + trial % 37);
    for (float& x : logits) x = std::round(normal(rng) * 2.0f) / 2.0f;  // coarse: many ties
    float value;
    int32_t want;
    cpu::argmax(ArgmaxParams{.logits = logits.data(), .values = &value, .columns = &want, .rows = 1,
                             .cols = static_cast<int64_t>(logits.size()),
                             .valid_cols = static_cast<int64_t>(logits.size())});
    EXPECT_EQ(sample_one(logits, SampleRow{.random = rng()}), want);
    EXPECT_EQ(sample_one(logits, SampleRow{.random = rng(), .temperature = 5.0f, .top_k = 1}), want);
  }
}

// With the random bits spread evenly over 2^64 (j · 2^48, j < 2^16), the
// draw u = floor(j · mass / 2^16) lands in each token's share of the kept
// mass exactly ceil(C_i 2^16 / mass) - ceil(C_(i-1) 2^16 / mass) times (C the
// running weight in column order): within one of weight · 2^16 / mass.
TEST(SampleOp, EvenlySpreadRandomBitsGiveExactFrequencies) {
  const float temperature = 0.7f;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, -4.0f, 0.0f};
  std::vector<uint64_t> w;
  uint64_t mass = 0;
  for (float l : logits) mass += w.emplace_back(sampling::weight(l, 2.0f, sampling::inverse_temperature(temperature)));
  const uint64_t draws = 1 << 16;
  std::vector<int64_t> got(logits.size(), 0);
  for (uint64_t j = 0; j < draws; ++j)
    ++got[static_cast<size_t>(sample_one(logits, SampleRow{.random = j << 48, .temperature = temperature}))];
  double total = 0.0;
  for (float l : logits) total += std::exp((l - 2.0) / temperature);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double share = static_cast<double>(w[i]) / static_cast<double>(mass);
    EXPECT_LT(std::abs(static_cast<double>(got[i]) - share * static_cast<double>(draws)), 1.0) << "token " << i;
    EXPECT_NEAR(share, std::exp((logits[i] - 2.0) / temperature) / total, 1e-9) << "token " << i;
  }
}

TEST(SampleOp, FrequenciesMatchTheDistribution) {
  const int draws = 20000;
  const double temperature = 0.8;
  // 7 degrees of freedom: P(chi2 > 24.32) = 0.001. Smallest expected count ~18.
  EXPECT_LT(chi_square(counts(kLogits, SampleRow{.temperature = 0.8f}, draws, 1), softmax(kLogits, temperature, 8), draws),
            24.32);
  // Top-k 3 renormalizes over the first three (2 degrees of freedom: 13.82).
  EXPECT_LT(chi_square(counts(kLogits, SampleRow{.temperature = 0.8f, .top_k = 3}, draws, 2),
                       softmax(kLogits, temperature, 3), draws),
            13.82);
  // Probabilities 0.470, 0.252, 0.135, ...: top-p 0.6 keeps two (1 degree of freedom: 10.83).
  EXPECT_LT(chi_square(counts(kLogits, SampleRow{.temperature = 0.8f, .top_p = 0.6f}, draws, 3),
                       softmax(kLogits, temperature, 2), draws),
            10.83);
}

TEST(SampleOp, TopKAndTopPNeverLeaveTheKeptSet) {
  // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top-p 0.8 keeps the first two.
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  std::vector<int64_t> n = counts(logits, SampleRow{.temperature = 1.0f, .top_p = 0.8f}, 2000, 11);
  EXPECT_EQ(n[2] + n[3], 0);
  EXPECT_GT(n[1], 300);
  n = counts(logits, SampleRow{.temperature = 100.0f, .top_k = 3}, 2000, 12);
  EXPECT_EQ(n[3], 0);
  EXPECT_GT(n[2], 500);
  // Ties at the top-k boundary: the lower columns are kept.
  n = counts({1.0f, 0.0f, 1.0f, 1.0f, 1.0f}, SampleRow{.temperature = 1.0f, .top_k = 2}, 2000, 13);
  EXPECT_EQ(n[1] + n[3] + n[4], 0);
  EXPECT_GT(n[2], 800);
  // Four equal weights: top-p 0.5 needs exactly two of them; a little more needs three.
  const std::vector<float> equal = {0.0f, 0.0f, 0.0f, 0.0f};
  n = counts(equal, SampleRow{.temperature = 1.0f, .top_p = 0.5f}, 2000, 14);
  EXPECT_EQ(n[2] + n[3], 0);
  n = counts(equal, SampleRow{.temperature = 1.0f, .top_p = 0.5001f}, 2000, 15);
  EXPECT_EQ(n[3], 0);
  EXPECT_GT(n[2], 500);
}

TEST(SampleOp, MinusInfinitiesAndPaddingAreNeverChosen) {
  std::vector<float> logits(50, -kInf);
  logits[17] = -3.0f;
  logits.push_back(100.0f);  // padding, past valid_cols
  logits.push_back(std::numeric_limits<float>::quiet_NaN());  // padding too: no effect
  for (uint64_t i = 0; i < 100; ++i) {
    const uint64_t random = sampling_random(4, 0, i);
    EXPECT_EQ(sample_one(logits, SampleRow{.random = random, .temperature = 1000.0f}, 50), 17);
    EXPECT_EQ(sample_one(logits, SampleRow{.random = random}, 50), 17);
  }
}

// A row holding a NaN or +inf, or with no logit above -inf (weights or a
// config that give non-finite values), has no token, greedy or sampled: id
// -1. A row of -infs but one finite logit has that one.
TEST(SampleOp, RowsWithANonFiniteLeaderHaveNoToken) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> rows = {std::vector<float>(9, nan), {-kInf, nan, -kInf, nan}, {-kInf},
                                                {1.0f, 2.0f, 3.0f, -nan}, {nan, 5.0f}, {1.0f, kInf, 2.0f},
                                                {-kInf, -5.0f, kInf}};
  for (const auto& logits : rows)
    for (float temperature : {0.0f, 1.0f, 1000.0f})
      EXPECT_EQ(sample_one(logits, SampleRow{.random = 7, .temperature = temperature, .top_p = 0.5f, .top_k = 2}), -1)
          << "temperature " << temperature << " row of " << logits.size() << " leading " << logits[0];
  for (float temperature : {0.0f, 1.0f})
    EXPECT_EQ(sample_one({-kInf, -kInf, -5.0f}, SampleRow{.random = 7, .temperature = temperature}), 2)
        << "one finite logit";
}

// The [shards][rows][cols] layout of gathered vocabulary shards samples as
// the plain rows do.
TEST(SampleOp, ShardedRowsSampleAsPlainRows) {
  const int64_t rows = 3, vocab = 1001, shards = 4, cols = 251;  // 4 · 251 = 1004: 3 padding columns
  std::mt19937 rng(8);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> plain(static_cast<size_t>(rows * vocab)), sharded(static_cast<size_t>(shards * rows * cols), 50.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < vocab; ++c)
      sharded[static_cast<size_t>(sampling::logit_index(r, c, rows, cols, shards))] =
          plain[static_cast<size_t>(r * vocab + c)] = normal(rng);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<SampleRow> settings;
    for (int64_t r = 0; r < rows; ++r)
      settings.push_back(SampleRow{.random = sampling_random(9, static_cast<uint64_t>(r), static_cast<uint64_t>(trial)),
                                   .temperature = 1.5f, .top_p = 0.9f, .top_k = static_cast<int32_t>(r * 40)});
    std::vector<int32_t> a(rows), b(rows);
    cpu::sample(SampleParams{.logits = plain.data(), .settings = settings.data(), .ids = a.data(), .rows = rows,
                             .cols = vocab, .valid_cols = vocab});
    cpu::sample(SampleParams{.logits = sharded.data(), .settings = settings.data(), .ids = b.data(), .rows = rows,
                             .cols = cols, .shards = shards, .valid_cols = vocab});
    EXPECT_EQ(a, b) << "trial " << trial;
  }
}

TEST(SampleOp, RefusesBadSettings) {
  const std::vector<float> logits = {1.0f, 2.0f};
  expect_error([&] { sample_one(logits, SampleRow{.temperature = -1.0f}); }, ErrorKind::kInternal,
               {"sample", "temperature", "-1"});
  expect_error([&] { sample_one(logits, SampleRow{.temperature = std::nanf("")}); }, ErrorKind::kInternal,
               {"temperature", "nan"});
  expect_error([&] { sample_one(logits, SampleRow{.temperature = kInf}); }, ErrorKind::kInternal, {"temperature"});
  expect_error([&] { sample_one(logits, SampleRow{.top_p = 0.0f}); }, ErrorKind::kInternal, {"top_p", "0"});
  expect_error([&] { sample_one(logits, SampleRow{.top_p = 1.5f}); }, ErrorKind::kInternal, {"top_p", "1.5"});
  expect_error([&] { sample_one(logits, SampleRow{.top_k = -2}); }, ErrorKind::kInternal, {"top_k", "-2"});
  expect_error([&] { sample_one(logits, SampleRow{}, 3); }, ErrorKind::kInternal, {"sample", "valid_cols=3"});
}

}  // namespace
}  // namespace lockstep
