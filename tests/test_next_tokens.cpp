// Greedy selection where the logits are, in two ops: argmax candidates per
// split of a rank's share, then next_tokens merging them over splits and
// ranks, feeding the ids back and publishing them. Checked against a plain
// scan of the whole row by the rule (NaN below every number, lowest id on
// ties), on odd sizes and shares with vocabulary padding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/argmax.h"
#include "kernels/next_tokens.h"

namespace lockstep {
namespace {

// The rule, written out on its own: the first largest logit of the row;
// -1 for a row holding a NaN or +inf, or nothing above -inf.
int32_t reference_argmax(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t c = 0; c < n; ++c) {
    if (std::isnan(row[c]) || row[c] == std::numeric_limits<float>::infinity()) return -1;
    if (row[c] > row[best]) best = c;
  }
  return row[best] > -std::numeric_limits<float>::infinity() ? static_cast<int32_t>(best) : -1;
}

// Rows with ties across split and share borders, NaNs (also leading a row),
// a row of NaNs, one of NaNs and -infs, one with a +inf (none of which has a
// token), one of -infs but one finite logit, and one of -infs only.
std::vector<float> awkward_logits(int64_t rows, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-4.0f, 4.0f);
  std::vector<float> v(static_cast<size_t>(rows * vocab));
  for (auto& x : v) x = d(rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t r = 0; r < rows; ++r) {
    float* row = v.data() + r * vocab;
    switch (r % 7) {
      case 0: row[vocab - 1] = row[vocab / 2] = 9.0f; break;  // a tie: the lower id wins
      case 1: row[r < 7 ? vocab - 1 : 0] = nan; break;  // one NaN, last in row 1, leading in row 8
      case 2: for (int64_t c = 0; c < vocab; ++c) row[c] = nan; break;
      case 3:
        for (int64_t c = 0; c < vocab; ++c) row[c] = c % 2 == 0 ? -std::numeric_limits<float>::infinity() : nan;
        break;
      case 4: row[vocab - 1] = std::numeric_limits<float>::infinity(); break;
      case 5:
        for (int64_t c = 0; c < vocab; ++c) row[c] = -std::numeric_limits<float>::infinity();
        row[vocab / 2] = -3.0f;
        break;
      default: for (int64_t c = 0; c < vocab; ++c) row[c] = -std::numeric_limits<float>::infinity(); break;
    }
  }
  return v;
}

// Candidates of every share ([shares][2][rows][splits]) as the group
// gathers them, then next_tokens' choice per row.
std::vector<int32_t> choose(const std::vector<float>& logits, int64_t rows, int64_t vocab, int64_t shares,
                            int64_t split_cols) {
  const int64_t share_cols = (vocab + shares - 1) / shares;
  ArgmaxParams a{.rows = rows, .cols = share_cols, .split_cols = split_cols};
  const int64_t per_share = 2 * rows * a.splits();
  std::vector<float> gathered(static_cast<size_t>(shares * per_share));
  for (int64_t s = 0; s < shares; ++s) {
    std::vector<float> share(static_cast<size_t>(rows * share_cols), -100.0f);  // padding columns
    const int64_t real = std::max<int64_t>(1, std::min(share_cols, vocab - s * share_cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < real && s * share_cols + c < vocab; ++c)
        share[static_cast<size_t>(r * share_cols + c)] = logits[static_cast<size_t>(r * vocab + s * share_cols + c)];
    float* block = gathered.data() + s * per_share;
    a.logits = share.data(), a.values = block, a.columns = reinterpret_cast<int32_t*>(block + rows * a.splits());
    a.valid_cols = real;
    cpu::argmax(a);
  }
  std::vector<int32_t> published(static_cast<size_t>(2 * rows));
  uint32_t count = 0;
  cpu::next_tokens(NextTokensParams{.candidates = gathered.data(),
                                    .shares = shares,
                                    .splits = a.splits(),
                                    .share_cols = share_cols,
                                    .vocab = vocab,
                                    .rows = rows,
                                    .published = published.data(),
                                    .published_stride = rows,
                                    .published_count = &count});
  EXPECT_EQ(count, 1u);
  return std::vector<int32_t>(published.begin(), published.begin() + rows);
}

TEST(NextTokens, GreedyOverSplitsAndSharesIsTheRowsArgmax) {
  for (int64_t vocab : {1, 5, 37, 300})
    for (int64_t shares : {1, 2, 3})
      for (int64_t split_cols : {0, 1, 7, 16, 100}) {
        const int64_t rows = 9;
        const std::vector<float> logits = awkward_logits(rows, vocab, static_cast<uint32_t>(vocab + shares));
        const std::vector<int32_t> got = choose(logits, rows, vocab, shares, split_cols);
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_EQ(got[static_cast<size_t>(r)], reference_argmax(logits.data() + r * vocab, vocab))
              << "vocab " << vocab << " shares " << shares << " split_cols " << split_cols << " row " << r;
      }
}

TEST(NextTokens, FeedsBackDecodeRowsAndAlternatesPublishedSlots) {
  const int32_t pad = 9;
  std::vector<int32_t> sampled{11, 12, 13, 14};
  std::vector<int32_t> tokens{1, 2, 3, 4}, positions{5, 30, 0, 31}, slots{0, 1, pad, 2};
  std::vector<int32_t> published(2 * 6, -1);
  uint32_t count = 0;
  NextTokensParams p{.sampled = sampled.data(),
                     .rows = 4,
                     .tokens = tokens.data(),
                     .positions = positions.data(),
                     .slots = slots.data(),
                     .padding_slot = pad,
                     .max_position = 31,
                     .published = published.data(),
                     .published_stride = 6,
                     .published_count = &count};
  cpu::next_tokens(p);
  EXPECT_EQ(tokens, sampled);
  EXPECT_EQ(positions, (std::vector<int32_t>{6, 31, 0, 31})) << "padding stays, the context's end caps";
  EXPECT_EQ(std::vector<int32_t>(published.begin(), published.begin() + 4), sampled);
  sampled = {21, 22, 23, 24};
  cpu::next_tokens(p);
  EXPECT_EQ(count, 2u);
  EXPECT_EQ(std::vector<int32_t>(published.begin() + 6, published.begin() + 10), sampled) << "the second slot";
  EXPECT_EQ(published[0], 11) << "the first slot keeps the step before";
  p.tokens = nullptr;  // no feed back: tokens and positions untouched
  sampled = {31, 32, 33, 34};
  cpu::next_tokens(p);
  EXPECT_EQ(tokens, (std::vector<int32_t>{21, 22, 23, 24}));
  EXPECT_EQ(published[0], 31);
  // A row with no token (-1) is published as such and fed back as token 0.
  p.tokens = tokens.data();
  sampled = {41, -1, 43, 44};
  cpu::next_tokens(p);
  EXPECT_EQ(tokens, (std::vector<int32_t>{41, 0, 43, 44}));
  EXPECT_EQ(std::vector<int32_t>(published.begin() + 6, published.begin() + 10), sampled);
}

TEST(NextTokens, MiswiredParamsAreRefused) {
  int32_t ids[2] = {0, 0}, published[4] = {};
  uint32_t count = 0;
  float candidates[4] = {};
  NextTokensParams both{.candidates = candidates, .sampled = ids, .rows = 1, .published = published,
                        .published_stride = 2, .published_count = &count};
  EXPECT_THROW(cpu::next_tokens(both), Error);
  NextTokensParams too_many{.sampled = ids, .rows = 3, .published = published, .published_stride = 2,
                            .published_count = &count};
  EXPECT_THROW(cpu::next_tokens(too_many), Error);
  EXPECT_EQ(count, 0u);
}

}  // namespace
}  // namespace lockstep
