// The tensor-parallel group: the one layer sequence of lockstep.
//
// forward() drives the runner's sub-phases and puts the collectives between
// them: per layer pre-o-proj -> o-proj -> all-reduce -> post-attention norm ->
// MLP -> all-reduce -> post-MLP norm, then the LM head and the all-gather of
// the vocab-parallel logits. Prefill, decode and batched steps all come
// through here, at any TP size (TP=1 uses the single-rank communicator).
#pragma once

#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/runner.h"
#include "tp/communicator.h"

namespace lockstep {

class TpGroup {
 public:
  TpGroup(Communicator& comm, Runner& runner);

  // Runs one step and returns the full-vocabulary float32 logits of the
  // batch's logit rows, [logit_rows, vocab], identical on every rank.
  const std::vector<float>& forward(const BatchDesc& batch);

  Communicator& comm() { return comm_; }
  Runner& runner() { return runner_; }
  int64_t vocab_size() const { return runner_.config().vocab_size; }

 private:
  void all_reduce(Runner::Span span);
  void gather_logits();

  Communicator& comm_;
  Runner& runner_;
  std::vector<uint8_t> local_raw_;
  std::vector<float> local_f32_;
  std::vector<float> gathered_;
  std::vector<float> logits_;
  std::vector<std::string> layer_names_;  // profiler range names, "layer N"
};

}  // namespace lockstep
