// One step's work: a list of tokens, each with its sequence slot and position.
// A prompt of P tokens (prefill) and one token from each of B sequences
// (decode) are both just a BatchDesc; nothing else distinguishes them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/sampling.h"

namespace lockstep {

struct BatchDesc {
  std::vector<int32_t> tokens;
  std::vector<int32_t> slots;
  std::vector<int32_t> positions;
  std::vector<int32_t> logit_rows;  // indices into tokens whose logits are returned, in order
  // One per logit row when the backend samples the step (TpGroup::enqueue with Choice::kSample); empty otherwise.
  std::vector<SampleRow> sample_rows;
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  void add(int32_t token, int32_t slot, int32_t position, bool want_logits) {
    if (want_logits) logit_rows.push_back(static_cast<int32_t>(tokens.size()));
    tokens.push_back(token);
    slots.push_back(slot);
    positions.push_back(position);
  }
};

// Sizes fixed at start-up; every buffer is allocated once from these.
struct RunnerLimits {
  int64_t max_slots = 1;        // sequences alive at once
  int64_t max_seq = 0;          // positions per sequence (KV cache length)
  int64_t max_step_tokens = 0;  // tokens per step (longer prompts are chunked)
  int64_t max_logit_rows = 0;   // rows of logits per step
  void validate() const;
};

// --diag shapes,attn,timing,numerics: parsed once, read by the runner.
struct Diagnostics {
  bool shapes = false;    // tensor shapes per step
  bool attn = false;      // attention lengths per token
  bool timing = false;    // per-layer wall time (synchronizes the backend)
  bool numerics = false;  // min / max / mean / rms of the residual stream per layer
  static Diagnostics parse(const std::string& list);  // comma-separated; throws on unknown names
  bool any() const { return shapes || attn || timing || numerics; }
};

}  // namespace lockstep
