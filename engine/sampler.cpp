#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"

namespace lockstep {

void SamplingParams::validate() const {
  LS_REQUIRE(std::isfinite(temperature) && temperature >= 0.0, ErrorKind::kInvalidArgument,
             "temperature must be a finite number >= 0, got {}", temperature);
  LS_REQUIRE(top_k >= 0, ErrorKind::kInvalidArgument, "top-k must be >= 0, got {}", top_k);
  LS_REQUIRE(top_p > 0.0 && top_p <= 1.0, ErrorKind::kInvalidArgument, "top-p must be in (0, 1], got {}", top_p);
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t sampling_random(uint64_t seed, uint64_t sequence, uint64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ sequence) ^ step);
}

Sampler::Sampler(const SamplingParams& params, uint64_t sequence) : params_(params), sequence_(sequence) {
  params_.validate();
}

// The settings in the op's float32 / int32 fields: a temperature below the
// smallest float becomes greedy, and a top-p below it the smallest positive
// float (in effect greedy too).
SampleRow Sampler::settings(uint64_t step) const {
  using Float = std::numeric_limits<float>;
  return SampleRow{
      .random = sampling_random(params_.seed, sequence_, step),
      .temperature = static_cast<float>(std::min(params_.temperature, static_cast<double>(Float::max()))),
      .top_p = std::max(static_cast<float>(params_.top_p), Float::denorm_min()),
      .top_k = static_cast<int32_t>(std::min<int64_t>(params_.top_k, std::numeric_limits<int32_t>::max()))};
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  const SampleRow row = next();
  int32_t id = 0;
  cpu::sample(SampleParams{.logits = logits, .settings = &row, .ids = &id, .rows = 1, .cols = vocab, .valid_cols = vocab});
  return id;
}

}  // namespace lockstep
