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
  // How a step's tokens are chosen: not at all (forward() returns the
  // logits), or where the logits are, by argmax (lowest id on ties) or by
  // the batch's sample_rows (one per logit row).
  enum class Choice { kLogits = 0, kGreedy = 1, kSample = 2 };

  // Queued steps, whose tokens are chosen where the logits are, identical
  // on every rank; only the ids cross to the host, with no copy after the
  // step (Runner::next_tokens). The host may queue a step before it has the
  // tokens of the one before, so that the device never waits for the host between steps
  // (asynchronous scheduling). At most two steps are queued; take_chosen()
  // waits for the oldest and returns its tokens.
  void enqueue(const BatchDesc& batch, Choice choice);
  // Whether the last queued step may be followed by enqueue_next(): it chose
  // its tokens on the device and its batch feeds back (Runner::batch_feeds_back).
  bool can_enqueue_next() const;
  // Queues the next decode step of the last queued batch without its
  // tokens: each row's token is the one the last step chose (on the device),
  // at a position one higher. `sample_rows`: the new step's settings, one per
  // logit row of that batch, for a batch that samples; empty for greedy.
  void enqueue_next(std::vector<SampleRow> sample_rows);
  // Waits for the oldest queued step; returns its tokens (the logit rows of
  // its batch, padding left out).
  const std::vector<int32_t>& take_chosen();
  // Waits for the queued steps and forgets their tokens (a caller that
  // stopped midway, by an exception, leaves none behind for the next).
  void drop_queued();

  // Replays the graph of the last step `times` times back to back with no
  // host work between (benchmarks: the GPU's time per step on its own).
  // False when that step ran from no captured graph. A step that feeds its
  // tokens back advances its batch each time (positions stop at the
  // context's end), so the next step must set a new batch.
  bool replay_captured(int times);

  Communicator& comm() { return comm_; }
  Runner& runner() { return runner_; }
  int64_t vocab_size() const { return runner_.config().vocab_size; }

 private:
  void step(const BatchDesc& batch, Choice choice);  // set_batch, then execute()
  // Runs the step set in the runner under graph key `key` (< 0: not a
  // decode-shaped batch, always eager): eagerly, captured, or replayed.
  void execute(int64_t key);
  void run_step(Choice choice);  // embedding .. LM head (and the choice) on the batch set in the runner
  int64_t bucket_for(const BatchDesc& batch) const;  // 0: not a decode-shaped batch
  // The graph of a bucket's steps whose batches have (or lack) no lower
  // writes, by how they choose their tokens.
  static int64_t graph_key(int64_t bucket, bool no_lower_writes, Choice choice) {
    return (2 * bucket + (no_lower_writes ? 1 : 0)) * 3 + static_cast<int64_t>(choice);
  }
  // After the step just run: counts its published tokens and queues it.
  void queue_chosen(int64_t rows);
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
  Choice choice_ = Choice::kLogits;  // of the last step
  int64_t key_ = -1;                 // the last step's graph key (< 0: none)
  bool batch_stale_ = false;         // replay_captured advanced the batch past the host's copy
  struct Queued {
    int64_t published;  // the index of its next_tokens call (< 0: it chose nothing)
    int64_t rows;       // its batch's own logit rows
  };
  std::vector<Queued> queued_;  // oldest first
  int64_t published_ = 0;       // next_tokens calls run so far (Runner::published_ids)
  int64_t last_rows_ = 0;       // the own logit rows of the last queued step
  std::vector<int32_t> chosen_;
};

}  // namespace lockstep
