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
  step(batch, Choice::kLogits);
  gather_logits();
  return logits_;
}

void TpGroup::enqueue(const BatchDesc& batch, Choice choice) {
  LS_REQUIRE(choice != Choice::kLogits, ErrorKind::kInternal, "enqueue: a step that returns logits is not queued");
  LS_REQUIRE(queued_.size() < Backend::kEvents, ErrorKind::kInternal, "enqueue: {} steps already queued",
             queued_.size());
  LS_REQUIRE(choice != Choice::kSample || batch.sample_rows.size() == batch.logit_rows.size(), ErrorKind::kInternal,
             "enqueue: {} sampling settings for {} logit rows", batch.sample_rows.size(), batch.logit_rows.size());
  step(batch, choice);
  queue_chosen(static_cast<int64_t>(batch.logit_rows.size()));
}

bool TpGroup::can_enqueue_next() const {
  return choice_ != Choice::kLogits && !batch_stale_ && runner_.batch_feeds_back() && runner_.batch_logit_rows() > 0;
}

void TpGroup::enqueue_next(std::vector<SampleRow> sample_rows) {
  LS_REQUIRE(can_enqueue_next(), ErrorKind::kInternal, "enqueue_next: the last step does not feed back its tokens");
  LS_REQUIRE(queued_.size() < Backend::kEvents, ErrorKind::kInternal, "enqueue_next: {} steps already queued",
             queued_.size());
  const auto own_rows = static_cast<int64_t>(sample_rows.size());
  LS_REQUIRE(own_rows == (choice_ == Choice::kSample ? last_rows_ : 0), ErrorKind::kInternal,
             "enqueue_next: {} sampling settings for {} rows of a {} step", own_rows, last_rows_,
             choice_ == Choice::kSample ? "sampled" : "greedy");
  if (choice_ == Choice::kSample)
    sample_rows.resize(static_cast<size_t>(runner_.batch_logit_rows()));  // padding rows: greedy
  runner_.advance_batch(sample_rows);
  execute(key_);
  queue_chosen(last_rows_);
}

void TpGroup::queue_chosen(int64_t rows) {
  Queued q{.published = -1, .rows = rows};
  if (runner_.batch_logit_rows() > 0) {
    q.published = published_++;
    runner_.backend().record_event(static_cast<int>(q.published % Backend::kEvents));
  }
  queued_.push_back(q);
  last_rows_ = rows;
}

const std::vector<int32_t>& TpGroup::take_chosen() {
  LS_REQUIRE(!queued_.empty(), ErrorKind::kInternal, "take_chosen: no step is queued");
  const Queued q = queued_.front();
  queued_.erase(queued_.begin());
  chosen_.clear();
  if (q.published < 0) return chosen_;
  comm_.wait_begins("the decode step's collectives");
  runner_.backend().wait_event(static_cast<int>(q.published % Backend::kEvents));
  comm_.wait_ends();
  const int32_t* ids = runner_.published_ids(q.published);
  chosen_.assign(ids, ids + q.rows);
  return chosen_;
}

void TpGroup::drop_queued() {
  while (!queued_.empty()) take_chosen();
}

void TpGroup::step(const BatchDesc& batch, Choice choice) {
  choice_ = choice;
  batch_stale_ = false;
  const int64_t bucket = bucket_for(batch);
  if (bucket == 0) {
    runner_.set_batch(batch);
    key_ = -1;
  } else {
    padded_ = batch;
    LS_CHECK(padded_.size() == bucket || runner_.has_padding_slot());
    while (padded_.size() < bucket) padded_.add(0, runner_.padding_slot(), 0, true);
    if (!padded_.sample_rows.empty()) padded_.sample_rows.resize(padded_.logit_rows.size());  // greedy
    runner_.set_batch(padded_);
    // A step bakes in its batch's no-lower-writes property (a decode batch
    // has it, a chunk of one prompt does not): one graph for each.
    key_ = graph_key(bucket, runner_.batch_no_lower_writes(), choice);
  }
  execute(key_);
}

void TpGroup::execute(int64_t key) {
  if (key < 0) {
    run_step(choice_);
    return;
  }
  const int steps = bucket_steps_[key]++;
  if (!graphs_ || steps == 0) {
    run_step(choice_);
    return;
  }
  if (steps == 1) {
    runner_.backend().capture_begin();
    run_step(choice_);
    runner_.backend().capture_end(key);
  }
  runner_.backend().replay(key);
}

bool TpGroup::replay_captured(int times) {
  LS_REQUIRE(queued_.empty(), ErrorKind::kInternal, "replay_captured: {} steps still queued", queued_.size());
  if (!graphs_ || key_ < 0 || bucket_steps_[key_] < 2) return false;
  for (int i = 0; i < times; ++i) runner_.backend().replay(key_);
  if (choice_ != Choice::kLogits && runner_.batch_logit_rows() > 0) published_ += times;
  batch_stale_ = true;
  return true;
}

void TpGroup::run_step(Choice choice) {
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
  if (choice == Choice::kGreedy) {
    runner_.argmax();
    const Runner::Span candidates = runner_.argmax_result();
    runner_.next_tokens(
        all_gather_in_backend(candidates.data, runner_.argmax_gathered(), candidates.count, DType::kF32));
  } else if (choice == Choice::kSample) {
    const Runner::Span local = runner_.logits_local();
    runner_.sample(all_gather_in_backend(local.data, runner_.logits_gathered(), local.count,
                                         runner_.backend().act_dtype()));
    runner_.next_tokens(nullptr);
  }
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
