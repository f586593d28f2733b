#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine/sampler.h"
#include "test_support.h"

namespace lockstep {
namespace {

TEST(Sampler, GreedyPicksTheLowestIndexOfTheMaximum) {
  std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f};
  Sampler s(SamplingParams{}, 0);
  EXPECT_EQ(s.sample(logits.data(), 4), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  std::vector<float> logits = {0.1f, 0.3f, 5.0f, 0.2f};
  Sampler s(SamplingParams{.temperature = 1.0, .top_k = 1, .seed = 3}, 0);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits.data(), 4), 2);
}

TEST(Sampler, TopPKeepsOnlyTheNucleus) {
  // Probabilities ~ [0.64, 0.24, 0.09, 0.03]: top-p 0.8 keeps the first two.
  std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  Sampler s(SamplingParams{.temperature = 1.0, .top_p = 0.8, .seed = 11}, 0);
  std::map<int, int> seen;
  for (int i = 0; i < 2000; ++i) ++seen[s.sample(logits.data(), 4)];
  EXPECT_EQ(seen.count(2) + seen.count(3), 0u);
  EXPECT_GT(seen[0], seen[1]);
  EXPECT_GT(seen[1], 300);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits = {0.5f, 0.4f, 0.3f, 0.2f, 0.1f};
  Sampler a(SamplingParams{.temperature = 0.9, .seed = 7}, 2), b(SamplingParams{.temperature = 0.9, .seed = 7}, 2);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits.data(), 5), b.sample(logits.data(), 5));
}

// The host path (sample on logits) and the backend path (next() settings
// uploaded with the batch) consume the same per-step random bits.
TEST(Sampler, SampleIsTheOpWithTheNextSettings) {
  std::vector<float> logits = {0.5f, 0.4f, 0.3f, 0.2f, 0.1f};
  const SamplingParams params{.temperature = 0.9, .top_k = 4, .top_p = 0.95, .seed = 7};
  Sampler host(params, 3), settings(params, 3);
  for (int i = 0; i < 50; ++i) {
    const SampleRow row = settings.next();
    EXPECT_EQ(row.random, sampling_random(7, 3, static_cast<uint64_t>(i)));
    int32_t id = -1;
    cpu::sample(SampleParams{.logits = logits.data(), .settings = &row, .ids = &id, .rows = 1, .cols = 5,
                             .valid_cols = 5});
    EXPECT_EQ(host.sample(logits.data(), 5), id) << "step " << i;
  }
  EXPECT_NE(sampling_random(7, 3, 0), sampling_random(7, 4, 0));
  EXPECT_NE(sampling_random(7, 3, 0), sampling_random(8, 3, 0));
}

TEST(Sampler, RefusesBadValues) {
  expect_error([] { SamplingParams{.temperature = -0.5}.validate(); }, ErrorKind::kInvalidArgument,
               {"temperature", "-0.5"});
  expect_error([] { SamplingParams{.top_p = 0.0}.validate(); }, ErrorKind::kInvalidArgument, {"top-p"});
  expect_error([] { SamplingParams{.top_p = 1.5}.validate(); }, ErrorKind::kInvalidArgument, {"top-p", "1.5"});
  expect_error([] { SamplingParams{.top_k = -1}.validate(); }, ErrorKind::kInvalidArgument, {"top-k"});
}

}  // namespace
}  // namespace lockstep
