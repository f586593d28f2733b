// Generation and scoring on top of the tensor-parallel group's forward step.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/sampler.h"
#include "tp/group.h"

namespace lockstep {

struct GenerationRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after emitting one of these
  // The sequence number the sampling bits are drawn for (sampling_random's
  // `sequence`); -1: the request's index in the generate() call.
  int64_t sampling_sequence = -1;
};

struct GenerationOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens.size(), vocab] when asked for: row i chose tokens[i]
  bool stopped = false;       // ended on a stop id rather than the token limit
};

// Called as each token is chosen: (request index, token).
using TokenCallback = std::function<void(size_t, int32_t)>;

class Generator {
 public:
  // overlap_steps: queue each decode step before the tokens of the one
  // before reach the host, where the tokens are sure to be the same as with
  // one step at a time (false: one step at a time, for comparison).
  explicit Generator(TpGroup& group, bool overlap_steps = true);

  // Runs the requests together, one sequence slot each: one prefill pass over
  // all prompts (chunked to the step limit), then decode steps of one token per
  // unfinished sequence. Requests are checked before any work (prompt ids in
  // the vocabulary, prompt + new tokens within the context, slots available).
  std::vector<GenerationOutput> generate(const std::vector<GenerationRequest>& requests, bool keep_logits,
                                         const TokenCallback& on_token = nullptr);

  // Teacher-forced logits of every prompt position, [prompt, vocab].
  std::vector<float> score(const std::vector<int32_t>& prompt);

 private:
  void check_request(const GenerationRequest& r) const;
  TpGroup& group_;
  bool overlap_steps_;
};

}  // namespace lockstep
