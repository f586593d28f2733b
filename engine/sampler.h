// Token selection settings per request, and the host side of sampling: the
// random bits of every step come from (seed, sequence, step) alone, so a
// sequence's tokens do not depend on where they are chosen (the CPU twin on
// host logits or the backend's sample op, kernels/sampling.h), on batching
// or on the TP degree.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace lockstep {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // (0, 1]
  uint64_t seed = 0;
  // Throws kInvalidArgument naming the bad value.
  void validate() const;
};

// 64 random bits for the `step`-th token of sequence `sequence` (splitmix64
// of the three, chained).
uint64_t sampling_random(uint64_t seed, uint64_t sequence, uint64_t step);

// One sequence's settings, step after step.
class Sampler {
 public:
  Sampler(const SamplingParams& params, uint64_t sequence);
  // The settings of this sequence's token number `step` (0: the first
  // generated one).
  SampleRow settings(uint64_t step) const;
  // The settings of this sequence's next token; each call is the next step.
  SampleRow next() { return settings(step_++); }
  // Chooses the next token from full-vocabulary float32 logits on the host,
  // with the settings of next().
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  uint64_t sequence_;
  uint64_t step_ = 0;
};

}  // namespace lockstep
