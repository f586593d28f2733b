// The tensor-parallel group: the one layer sequence of lockstep.
//
// forward() drives the runner's sub-phases and puts the collectives between
// them: per layer pre-o-proj -> o-proj -> all-reduce -> post-attention norm ->
// MLP -> all-reduce -> post-MLP norm, then the LM head and the all-gather of
// the vocab-parallel logits. Prefill, decode and batched steps all come
// through here, at any TP size (TP=1 uses the single-rank communicator).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/runner.h"
#include "tp/communicator.h"

namespace lockstep {

class TpGroup {
 public:
  // graphs: replay decode steps from graphs captured per bucket (the backend
  // must support graphs; the collectives between the sub-phases must be
  // capturable, which holds at TP=1).
  TpGroup(Communicator& comm, Runner& runner, bool graphs);

  // Runs one step and returns the full-vocabulary float32 logits of the
  // batch's logit rows, [logit_rows, vocab], identical on every rank.
  //
  // A decode-shaped batch (every token wants logits, at most the largest
  // bucket) is padded to its bucket size (1, 2, 4, ... up to the batch
  // limit) with rows in the runner's padding slot, graphs or not, so eager
  // and graphed steps run the same kernels on the same shapes. With graphs a
  // bucket's first step runs eagerly (loading every kernel) and the second
  // captures the step; from then on it is replayed. Rows past the batch's
  // own are padding and are to be ignored.
  const std::vector<float>& forward(const BatchDesc& batch);
  // The same step, then greedy selection where the logits are: returns the
  // argmax token of each logit row (lowest id on ties), identical on every
  // rank (one per logit row of the batch, none for padding); only ids and
  // values cross to the host.
  const std::vector<int32_t>& forward_greedy(const BatchDesc& batch);
  // The same step, then sampling where the logits are, by the batch's
  // sample_rows (one per logit row): the logits are all-gathered in backend
  // memory and every rank runs the backend's sample op on the full rows, so
  // every rank picks the same ids; only the ids cross to the host.
  const std::vector<int32_t>& forward_sample(const BatchDesc& batch);

  // Replays the graph of the bucket that holds `batch_size` rows `times`
  // times back to back with no host work between (benchmarks: the GPU's
  // time per step on its own), on the batch set by the last step. False when
  // that bucket has no captured graph yet.
  bool replay_captured(int64_t batch_size, int times);

  Communicator& comm() { return comm_; }
  Runner& runner() { return runner_; }
  int64_t vocab_size() const { return runner_.config().vocab_size; }

 private:
  void step(const BatchDesc& batch);  // set_batch, then run_step() eagerly or from a graph
  void run_step();  // embedding .. LM head on the batch set in the runner
  int64_t bucket_for(const BatchDesc& batch) const;  // 0: not a decode-shaped batch
  // The graph of a bucket's steps whose batches have (or lack) no lower writes.
  static int64_t graph_key(int64_t bucket, bool no_lower_writes) { return 2 * bucket + (no_lower_writes ? 1 : 0); }
  void all_reduce(Runner::Span span);
  // All-gathers `count` elements per rank in backend memory; returns where the
  // gathered blocks are (`send` itself with one rank).
  const void* all_gather_in_backend(const void* send, void* recv, int64_t count, DType dtype);
  void gather_logits();

  Communicator& comm_;
  Runner& runner_;
  std::vector<uint8_t> gathered_raw_;
  std::vector<float> gathered_;
  std::vector<float> logits_;
  std::vector<std::string> layer_names_;  // profiler range names, "layer N"
  bool graphs_;
  std::vector<int64_t> buckets_;
  std::map<int64_t, int> bucket_steps_;  // steps run per graph key (graphs: 1 eager, then captured)
  BatchDesc padded_;
  std::vector<uint8_t> argmax_host_;  // [ranks][values (rows) | columns (rows)]
  std::vector<int32_t> greedy_ids_;
  std::vector<int32_t> sampled_ids_;
};

}  // namespace lockstep
