#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace lockstep {

void SamplingParams::validate() const {
  LS_REQUIRE(std::isfinite(temperature) && temperature >= 0.0, ErrorKind::kInvalidArgument,
             "temperature must be >= 0, got {}", temperature);
  LS_REQUIRE(top_k >= 0, ErrorKind::kInvalidArgument, "top-k must be >= 0, got {}", top_k);
  LS_REQUIRE(top_p > 0.0 && top_p <= 1.0, ErrorKind::kInvalidArgument, "top-p must be in (0, 1], got {}", top_p);
}

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

// Each sequence gets its own stream of the seeded generator.
Sampler::Sampler(const SamplingParams& params, uint64_t stream)
    : params_(params), rng_(params.seed * 0x9e3779b97f4a7c15ull + stream) {
  params_.validate();
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (params_.temperature == 0.0) return argmax(logits, vocab);
  candidates_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    candidates_[static_cast<size_t>(i)] = {logits[i], static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<long>(keep), candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  // Softmax over the kept candidates at the given temperature.
  std::vector<double> probs(keep);
  const double max_logit = candidates_[0].first;
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    total += probs[i];
  }
  // Top-p: the smallest prefix whose probability reaches top_p.
  double cumulative = 0.0;
  size_t nucleus = keep;
  for (size_t i = 0; i < keep; ++i) {
    cumulative += probs[i] / total;
    if (cumulative >= params_.top_p) {
      nucleus = i + 1;
      break;
    }
  }
  double mass = 0.0;
  for (size_t i = 0; i < nucleus; ++i) mass += probs[i];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < nucleus; ++i) {
    u -= probs[i];
    if (u < 0.0) return candidates_[i].second;
  }
  return candidates_[nucleus - 1].second;
}

}  // namespace lockstep
