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
  // A further end condition (the CLI's stop strings): called with each
  // generated token in order as it is appended, before the token is reported
  // (on_token); true ends the request with that token, in the same step and
  // in the same way as a stop id. It may keep state between calls (the
  // caller's, for one generate() call), but must decide from the tokens
  // alone, so that every tensor-parallel rank decides alike.
  std::function<bool(int32_t)> stops_after;
  // The sequence number the sampling bits are drawn for (sampling_random's
  // `sequence`); -1: the request's index in the generate() call.
  int64_t sampling_sequence = -1;
};

struct GenerationOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens.size(), vocab] when asked for: row i chose tokens[i]
  bool stopped = false;       // ended on a stop id or stops_after rather than the token limit
};

// Called as each token is chosen: (request index, token).
using TokenCallback = std::function<void(size_t, int32_t)>;
// Called once a request is done, after its last token: (request index, its output).
using DoneCallback = std::function<void(size_t, const GenerationOutput&)>;

class Generator {
 public:
  // overlap_steps: queue each decode step before the tokens of the one
  // before reach the host, where the tokens are sure to be the same as with
  // one step at a time (false: one step at a time, for comparison).
  explicit Generator(TpGroup& group, bool overlap_steps = true);

  // Runs the requests with continuous batching: each takes a sequence slot as
  // one is free (all at once when there are no more requests than slots), its
  // prompt is prefilled (chunked to the step limit), and its tokens come from
  // decode steps of one token per active sequence; a finished request's slot
  // goes to the next. Requests are checked before any work (prompt ids in the
  // vocabulary, prompt + new tokens within the context).
  std::vector<GenerationOutput> generate(const std::vector<GenerationRequest>& requests, bool keep_logits,
                                         const TokenCallback& on_token = nullptr,
                                         const DoneCallback& on_done = nullptr);

  // Fails, naming the problem, on a request generate() would refuse: an empty
  // prompt, an id outside the vocabulary, a prompt and new tokens past the
  // context, bad sampling settings.
  void check(const GenerationRequest& r) const;

  // Teacher-forced logits of every prompt position, [prompt, vocab].
  std::vector<float> score(const std::vector<int32_t>& prompt);

  // Prefix reuse (off by default): the generator keeps track of which tokens
  // each sequence slot's KV cache holds, within a call and between calls, and
  // a request prefills only what follows the longest prefix of its prompt
  // (all but its last token) that a slot holds: its own slot's in place,
  // another's copied (Runner::copy_kv_prefix), or one that a request beside
  // it is prefilling, copied once it is in. A conversation's next turn
  // prefills only the new messages; prompts with a shared system prompt
  // prefill it once. Nothing else may write the group's cache meanwhile. On
  // the CPU backend the tokens and logits are those of a whole prefill, bit
  // for bit (its products and attention do not depend on the batch); on the
  // GPU in bf16 a product over other row counts rounds differently, so
  // near-ties can go the other way.
  void set_prefix_reuse(bool on);
  // Per request of the last generate(): its prompt tokens found in the cache.
  const std::vector<int64_t>& reused_prompt_tokens() const { return reused_; }

 private:
  TpGroup& group_;
  bool overlap_steps_;
  bool prefix_reuse_ = false;
  std::vector<std::vector<int32_t>> slot_tokens_;  // what each slot's cache holds, position by position
  std::vector<int64_t> reused_;
};

}  // namespace lockstep
