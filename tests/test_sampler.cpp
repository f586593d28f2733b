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

TEST(Sampler, RefusesBadValues) {
  expect_error([] { SamplingParams{.temperature = -0.5}.validate(); }, ErrorKind::kInvalidArgument,
               {"temperature", "-0.5"});
  expect_error([] { SamplingParams{.top_p = 0.0}.validate(); }, ErrorKind::kInvalidArgument, {"top-p"});
  expect_error([] { SamplingParams{.top_p = 1.5}.validate(); }, ErrorKind::kInvalidArgument, {"top-p", "1.5"});
  expect_error([] { SamplingParams{.top_k = -1}.validate(); }, ErrorKind::kInvalidArgument, {"top-k"});
}

}  // namespace
}  // namespace lockstep
