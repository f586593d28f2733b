// The speed of a generation, logged after it as llama.cpp and vLLM report
// theirs: the time to the first token (the prompt's prefill and the first
// sample) and the rate of the tokens after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <fmt/format.h>

namespace lockstep::cli {

class GenerationClock {
 public:
  // Called as each token arrives.
  void token() {
    if (!first_) first_ = Clock::now();
  }
  // From the clock's construction to the first token (nullopt: none yet).
  std::optional<double> seconds_to_first() const {
    if (!first_) return std::nullopt;
    return seconds(start_, *first_);
  }
  // From the first token to now (0 without one).
  double seconds_after_first() const { return first_ ? seconds(*first_, Clock::now()) : 0.0; }
  // One request: "first token after X ms (P prompt tok/s); N more in Y ms (R tok/s)".
  std::string summary(int64_t prompt_tokens, int64_t generated) const {
    if (!first_) return "no token generated";
    const double first = seconds(start_, *first_), rest = seconds_after_first();
    std::string s = fmt::format("first token after {:.1f} ms ({:.1f} prompt tok/s)", 1e3 * first,
                                static_cast<double>(prompt_tokens) / first);
    if (generated > 1 && rest > 0)
      s += fmt::format("; {} more in {:.1f} ms ({:.1f} tok/s)", generated - 1, 1e3 * rest,
                       static_cast<double>(generated - 1) / rest);
    return s;
  }
  // Many requests (their prefills interleaved with decoding): "in X ms (R tok/s), the first after Y ms".
  std::string throughput(int64_t generated) const {
    if (!first_) return "no token generated";
    const double all = seconds(start_, Clock::now());
    return fmt::format("in {:.1f} ms ({:.1f} tok/s over all requests), the first after {:.1f} ms", 1e3 * all,
                       static_cast<double>(generated) / all, 1e3 * seconds(start_, *first_));
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
  Clock::time_point start_ = Clock::now();
  std::optional<Clock::time_point> first_;
};

}  // namespace lockstep::cli
