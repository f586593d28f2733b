#include "tp/group.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace lockstep {

TpGroup::TpGroup(Communicator& comm, Runner& runner, bool graphs) : comm_(comm), runner_(runner), graphs_(graphs) {
  LS_REQUIRE(comm.size() == runner.plan().size && comm.rank() == runner.plan().rank, ErrorKind::kInternal,
             "communicator (rank {} of {}) does not match the shard plan (rank {} of {})", comm.rank(), comm.size(),
             runner.plan().rank, runner.plan().size);
  for (int64_t l = 0; l < runner.config().num_layers; ++l) layer_names_.push_back(fmt::format("layer {}", l));
  LS_REQUIRE(!graphs || runner.backend().supports_graphs(), ErrorKind::kInternal, "backend {} has no graphs",
             runner.backend().name());
  const RunnerLimits& lim = runner.limits();
  const int64_t cap = std::min({lim.max_slots, lim.max_step_tokens, lim.max_logit_rows});
  for (int64_t b = 1; b < cap; b *= 2) buckets_.push_back(b);
  buckets_.push_back(cap);
}

int64_t TpGroup::bucket_for(const BatchDesc& batch) const {
  // Only backends with graphs pad: elsewhere padding would be work for nothing.
  if (!runner_.backend().supports_graphs() || batch.logit_rows.size() != batch.tokens.size()) return 0;
  for (size_t i = 0; i < batch.logit_rows.size(); ++i)
    if (batch.logit_rows[i] != static_cast<int32_t>(i)) return 0;
  for (int64_t b : buckets_)
    if (batch.size() <= b) return b;
  return 0;
}

// With one rank the gathered blocks are the local block itself: no
// collective and no copy (the single-rank communicator copies host memory
// only, and these buffers live in backend memory).
const void* TpGroup::all_gather_in_backend(const void* send, void* recv, int64_t count, DType dtype) {
  if (comm_.size() == 1) return send;
  comm_.all_gather(send, recv, count, dtype);
  return recv;
}

void TpGroup::all_reduce(Runner::Span span) {
  comm_.all_reduce_sum(span.data, span.count, runner_.backend().act_dtype());
}

const std::vector<float>& TpGroup::forward(const BatchDesc& batch) {
  step(batch);
  gather_logits();
  return logits_;
}

// Greedy without the logits: each rank's best (value, column) per row is
// gathered in backend memory and copied to the host once; the lowest-ranked
// (lowest id) maximum wins, so every rank picks the same token.
const std::vector<int32_t>& TpGroup::forward_greedy(const BatchDesc& batch) {
  step(batch);
  runner_.argmax();
  const int64_t rows = runner_.batch_logit_rows();
  const Runner::Span result = runner_.argmax_result();  // [values | columns], 4-byte elements
  const void* gathered = all_gather_in_backend(result.data, runner_.argmax_gathered(), result.count, DType::kF32);
  argmax_host_.resize(static_cast<size_t>(result.count * comm_.size()) * 4);
  comm_.wait_begins("the decode step's collectives");
  runner_.backend().to_host(argmax_host_.data(), gathered, static_cast<int64_t>(argmax_host_.size()));
  comm_.wait_ends();
  const int64_t vl = runner_.plan().vocab_local;
  greedy_ids_.assign(static_cast<size_t>(rows), 0);
  for (int64_t row = 0; row < rows; ++row) {
    bool found = false;
    float best = 0.0f;
    for (int r = 0; r < comm_.size(); ++r) {  // ranks in vocabulary order: ties keep the lower id
      if (r * vl >= vocab_size()) break;       // a share of padding only
      float value;
      int32_t column;
      const uint8_t* block = argmax_host_.data() + static_cast<size_t>(r * result.count) * 4;
      std::memcpy(&value, block + static_cast<size_t>(row) * 4, 4);
      std::memcpy(&column, block + static_cast<size_t>(rows + row) * 4, 4);
      if (!found || value > best) {
        best = value;
        greedy_ids_[static_cast<size_t>(row)] = static_cast<int32_t>(r * vl + column);
        found = true;
      }
    }
  }
  greedy_ids_.resize(batch.logit_rows.size());  // rows past the batch's own pad it to its bucket
  return greedy_ids_;
}

const std::vector<int32_t>& TpGroup::forward_sample(const BatchDesc& batch) {
  LS_REQUIRE(batch.sample_rows.size() == batch.logit_rows.size(), ErrorKind::kInternal,
             "forward_sample: {} sampling settings for {} logit rows", batch.sample_rows.size(),
             batch.logit_rows.size());
  step(batch);
  sampled_ids_.clear();
  if (batch.logit_rows.empty()) return sampled_ids_;  // a prefill chunk that chooses nothing
  const Runner::Span local = runner_.logits_local();
  runner_.sample(all_gather_in_backend(local.data, runner_.logits_gathered(), local.count,
                                       runner_.backend().act_dtype()));
  sampled_ids_.resize(static_cast<size_t>(runner_.batch_logit_rows()));
  comm_.wait_begins("the decode step's collectives");
  runner_.backend().to_host(sampled_ids_.data(), runner_.sampled_ids(), static_cast<int64_t>(sampled_ids_.size()) * 4);
  comm_.wait_ends();
  sampled_ids_.resize(batch.logit_rows.size());  // rows past the batch's own pad it to its bucket
  return sampled_ids_;
}

void TpGroup::step(const BatchDesc& batch) {
  const int64_t bucket = bucket_for(batch);
  if (bucket == 0) {
    runner_.set_batch(batch);
    run_step();
  } else {
    padded_ = batch;
    LS_CHECK(padded_.size() == bucket || runner_.has_padding_slot());
    while (padded_.size() < bucket) padded_.add(0, runner_.padding_slot(), 0, true);
    if (!padded_.sample_rows.empty()) padded_.sample_rows.resize(padded_.logit_rows.size());  // greedy
    runner_.set_batch(padded_);
    // A step bakes in its batch's no-lower-writes property (a decode batch
    // has it, a chunk of one prompt does not): one graph for each.
    const int64_t key = graph_key(bucket, runner_.batch_no_lower_writes());
    const int steps = bucket_steps_[key]++;
    if (!graphs_ || steps == 0) {
      run_step();
    } else {
      if (steps == 1) {
        runner_.backend().capture_begin();
        run_step();
        runner_.backend().capture_end(key);
      }
      runner_.backend().replay(key);
    }
  }
}

bool TpGroup::replay_captured(int64_t batch_size, int times) {
  const auto bucket = std::find_if(buckets_.begin(), buckets_.end(), [&](int64_t b) { return batch_size <= b; });
  if (!graphs_ || bucket == buckets_.end()) return false;
  const int64_t key = graph_key(*bucket, runner_.batch_no_lower_writes());
  if (bucket_steps_[key] < 2) return false;
  for (int i = 0; i < times; ++i) runner_.backend().replay(key);
  return true;
}

void TpGroup::run_step() {
  runner_.embed();
  all_reduce(runner_.embedding_partial());
  const bool timing = runner_.diagnostics().timing || runner_.diagnostics().numerics;
  for (int64_t layer = 0; layer < runner_.config().num_layers; ++layer) {
    auto start = std::chrono::steady_clock::now();
    runner_.backend().range_push(layer_names_[static_cast<size_t>(layer)].c_str());
    runner_.pre_o_proj(layer);
    runner_.o_proj(layer);
    all_reduce(runner_.layer_partial());
    runner_.mlp(layer);
    all_reduce(runner_.layer_partial());
    runner_.backend().range_pop();
    if (timing) {
      runner_.backend().synchronize();
      runner_.log_layer_diagnostics(
          layer, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  runner_.lm_head();
}

// Each rank holds [rows, vocab_local] of the padded vocabulary. The
// all-gather runs in backend memory (on the GPU: on the compute stream); the
// one host wait of the step is the copy of the gathered logits, after which
// every rank re-assembles [rows, vocab], dropping the padding columns so that
// padding can never be sampled.
void TpGroup::gather_logits() {
  const Runner::Span local = runner_.logits_local();
  const int64_t rows = runner_.batch_logit_rows();
  const int64_t vl = runner_.plan().vocab_local;
  const int64_t vocab = runner_.config().vocab_size;
  const DType act = runner_.backend().act_dtype();
  const void* gathered = all_gather_in_backend(local.data, runner_.logits_gathered(), local.count, act);
  const size_t total = static_cast<size_t>(local.count * comm_.size());
  gathered_raw_.resize(total * dtype_size(act));
  comm_.wait_begins("the decode step's collectives");
  runner_.backend().to_host(gathered_raw_.data(), gathered, static_cast<int64_t>(gathered_raw_.size()));
  comm_.wait_ends();
  gathered_.resize(total);
  convert_to_f32(gathered_raw_.data(), act, gathered_.data(), total);
  logits_.assign(static_cast<size_t>(rows * vocab), 0.0f);
  for (int r = 0; r < comm_.size(); ++r) {
    const int64_t begin = r * vl;
    const int64_t width = std::min(vl, vocab - begin);
    if (width <= 0) continue;
    for (int64_t row = 0; row < rows; ++row)
      std::memcpy(&logits_[static_cast<size_t>(row * vocab + begin)],
                  &gathered_[static_cast<size_t>((r * rows + row) * vl)], static_cast<size_t>(width) * 4);
  }
}

}  // namespace lockstep
