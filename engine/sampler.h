// Token selection from full-vocabulary logits: greedy at temperature 0, else
// temperature, top-k and top-p (nucleus) sampling with a seeded generator.
// Every rank sees the same gathered logits and the same seed, so every rank
// picks the same token without another collective.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace lockstep {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
  // Throws kInvalidArgument naming the bad value.
  void validate() const;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t stream);
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// Index of the largest logit, the lowest index on ties.
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace lockstep
