#include "engine/generate.h"

#include <algorithm>

#include "common/error.h"

namespace lockstep {

Generator::Generator(TpGroup& group, bool overlap_steps) : group_(group), overlap_steps_(overlap_steps) {}

void Generator::check_request(const GenerationRequest& r) const {
  const Runner& runner = group_.runner();
  const int64_t vocab = runner.config().vocab_size;
  LS_REQUIRE(!r.prompt.empty(), ErrorKind::kInvalidArgument, "the prompt is empty");
  for (int32_t id : r.prompt)
    LS_REQUIRE(id >= 0 && id < vocab, ErrorKind::kInvalidArgument,
               "prompt token id {} is outside the vocabulary [0, {})", id, vocab);
  for (int32_t id : r.stop_ids)
    LS_REQUIRE(id >= 0 && id < vocab, ErrorKind::kInvalidArgument, "stop id {} is outside the vocabulary [0, {})",
               id, vocab);
  LS_REQUIRE(r.max_new_tokens >= 0, ErrorKind::kInvalidArgument, "max new tokens must be >= 0, got {}",
             r.max_new_tokens);
  const int64_t needed = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
  LS_REQUIRE(needed <= runner.limits().max_seq, ErrorKind::kInvalidArgument,
             "prompt ({} tokens) + max new tokens ({}) = {} exceeds the context length {}", r.prompt.size(),
             r.max_new_tokens, needed, runner.limits().max_seq);
  r.sampling.validate();
}

namespace {

// One generate() call: the requests, their outputs so far and the steps
// that produce them.
class GenerationRun {
 public:
  // cached[s]: request s's first prompt tokens already in its slot's cache.
  GenerationRun(TpGroup& group, const std::vector<GenerationRequest>& requests, bool keep_logits,
                const TokenCallback& on_token, const std::vector<int64_t>& cached)
      : group_(group), requests_(requests), keep_logits_(keep_logits), on_token_(on_token), cached_(cached),
        out_(requests.size()), vocab_(group.vocab_size()) {
    for (size_t i = 0; i < requests.size(); ++i)
      samplers_.emplace_back(requests[i].sampling, requests[i].sampling_sequence >= 0
                                                       ? static_cast<uint64_t>(requests[i].sampling_sequence)
                                                       : i);
    // Without logits to keep, the ids are chosen where the logits are (on
    // the GPU), so no logits cross to the host: by argmax when every request
    // is greedy, else by the sample op. Kept logits come to the host, where
    // the CPU twin of the sample op chooses the same ids.
    greedy_ = std::all_of(requests.begin(), requests.end(),
                          [](const GenerationRequest& r) { return r.sampling.temperature == 0.0; });
    choice_ = greedy_ ? TpGroup::Choice::kGreedy : TpGroup::Choice::kSample;
  }

  // All prompts' tokens not in the cache in steps of at most
  // max_step_tokens; the last token of each prompt asks for logits.
  void prefill() {
    const RunnerLimits& limits = group_.runner().limits();
    std::vector<std::pair<size_t, int32_t>> pending;  // (seq, position)
    for (size_t s = 0; s < requests_.size(); ++s)
      for (size_t p = static_cast<size_t>(cached_[s]); p < requests_[s].prompt.size(); ++p)
        pending.emplace_back(s, static_cast<int32_t>(p));
    for (size_t begin = 0; begin < pending.size();) {
      BatchDesc batch;
      std::vector<size_t> row_seq;
      while (begin < pending.size() && batch.size() < limits.max_step_tokens &&
             static_cast<int64_t>(row_seq.size()) < limits.max_logit_rows) {
        auto [seq, pos] = pending[begin++];
        bool last = static_cast<size_t>(pos) + 1 == requests_[seq].prompt.size();
        bool want = last && requests_[seq].max_new_tokens > 0;
        batch.add(requests_[seq].prompt[static_cast<size_t>(pos)], static_cast<int32_t>(seq), pos, want);
        if (want) row_seq.push_back(seq);
      }
      run(batch, row_seq);
    }
  }

  // One token per unfinished sequence per step.
  void decode(bool overlap_steps) {
    if (keep_logits_) {
      for (std::vector<size_t> row_seq = unfinished(); !row_seq.empty(); row_seq = unfinished()) {
        BatchDesc batch = decode_batch(row_seq);
        run(batch, row_seq);
      }
      return;
    }
    // With the ids chosen on the device, the next step is queued before this
    // one's ids reach the host whenever it is sure to run as the synchronous
    // loop would run it: the same sequences (none reaches its token limit
    // with this step's token), each fed its chosen token on the device. When
    // a sequence stops on a stop id instead, the queued step is dropped, so
    // the steps and their batches, and with them the tokens, are those of the
    // synchronous loop.
    for (std::vector<size_t> row_seq = unfinished(); !row_seq.empty(); row_seq = unfinished()) {
      BatchDesc batch = decode_batch(row_seq);
      batch.sample_rows = settings(row_seq, 0);
      group_.enqueue(batch, choice_);
      while (true) {
        const bool ahead = overlap_steps && group_.can_enqueue_next() &&
                           std::all_of(row_seq.begin(), row_seq.end(), [&](size_t s) {
                             return static_cast<int64_t>(out_[s].tokens.size()) + 1 < requests_[s].max_new_tokens;
                           });
        if (ahead) group_.enqueue_next(settings(row_seq, 1));
        const bool stopped = take(row_seq);
        if (!ahead) break;
        if (!stopped) continue;  // the queued step is the next one
        group_.take_chosen();    // dropped
        break;
      }
    }
  }

  std::vector<GenerationOutput> result() { return std::move(out_); }

 private:
  // Appends the chosen token (and its logits row) and reports it.
  void append(size_t seq, int32_t token, const float* row) {
    out_[seq].tokens.push_back(token);
    if (row != nullptr) out_[seq].logits.insert(out_[seq].logits.end(), row, row + vocab_);
    if (on_token_) on_token_(seq, token);
    const auto& stops = requests_[seq].stop_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) out_[seq].stopped = true;
  }
  // Appends the oldest queued step's tokens; whether a sequence stopped.
  bool take(const std::vector<size_t>& row_seq) {
    const std::vector<int32_t>& ids = group_.take_chosen();
    bool stopped = false;
    for (size_t i = 0; i < row_seq.size(); ++i) {
      append(row_seq[i], ids[i], nullptr);
      stopped = stopped || out_[row_seq[i]].stopped;
    }
    return stopped;
  }
  // The sampling settings of each row's token `ahead` tokens past those it
  // has (greedy: none).
  std::vector<SampleRow> settings(const std::vector<size_t>& row_seq, uint64_t ahead) const {
    std::vector<SampleRow> rows;
    if (!greedy_)
      for (size_t seq : row_seq) rows.push_back(samplers_[seq].settings(out_[seq].tokens.size() + ahead));
    return rows;
  }
  // Runs the step and chooses the next token of each of its logit rows.
  void run(BatchDesc& batch, const std::vector<size_t>& row_seq) {
    if (!keep_logits_) {
      batch.sample_rows = settings(row_seq, 0);
      group_.enqueue(batch, choice_);
      take(row_seq);
      return;
    }
    const std::vector<float>& logits = group_.forward(batch);
    for (size_t i = 0; i < row_seq.size(); ++i) {
      const float* row = &logits[i * static_cast<size_t>(vocab_)];
      append(row_seq[i], samplers_[row_seq[i]].sample(row, vocab_), row);
    }
  }
  std::vector<size_t> unfinished() const {
    std::vector<size_t> row_seq;
    for (size_t s = 0; s < requests_.size(); ++s)
      if (!out_[s].stopped && static_cast<int64_t>(out_[s].tokens.size()) < requests_[s].max_new_tokens)
        row_seq.push_back(s);
    return row_seq;
  }
  BatchDesc decode_batch(const std::vector<size_t>& row_seq) const {
    BatchDesc batch;
    for (size_t s : row_seq)
      batch.add(out_[s].tokens.back(), static_cast<int32_t>(s),
                static_cast<int32_t>(requests_[s].prompt.size() + out_[s].tokens.size() - 1), true);
    return batch;
  }

  TpGroup& group_;
  const std::vector<GenerationRequest>& requests_;
  bool keep_logits_;
  const TokenCallback& on_token_;
  const std::vector<int64_t>& cached_;
  std::vector<GenerationOutput> out_;
  std::vector<Sampler> samplers_;
  int64_t vocab_;
  bool greedy_ = true;
  TpGroup::Choice choice_ = TpGroup::Choice::kGreedy;
};

}  // namespace

std::vector<GenerationOutput> Generator::generate(const std::vector<GenerationRequest>& requests, bool keep_logits,
                                                  const TokenCallback& on_token) {
  const RunnerLimits& limits = group_.runner().limits();
  LS_REQUIRE(static_cast<int64_t>(requests.size()) <= limits.max_slots, ErrorKind::kInvalidArgument,
             "{} sequences exceed the batch limit of {}", requests.size(), limits.max_slots);
  for (const auto& r : requests) check_request(r);
  group_.drop_queued();
  std::vector<int64_t> cached(requests.size(), 0);
  for (size_t s = 0; s < requests.size() && s < slot_tokens_.size(); ++s) {
    const std::vector<int32_t>& held = slot_tokens_[s];
    const std::vector<int32_t>& prompt = requests[s].prompt;
    const size_t limit = std::min(held.size(), prompt.size() - 1);  // the last prompt token runs for its logits
    cached[s] = std::mismatch(prompt.begin(), prompt.begin() + static_cast<long>(limit), held.begin()).first -
                prompt.begin();
  }
  slot_tokens_.clear();  // nothing is claimed while the run writes (a failed run leaves the cache unknown)
  GenerationRun run(group_, requests, keep_logits, on_token, cached);
  run.prefill();
  run.decode(overlap_steps_);
  std::vector<GenerationOutput> out = run.result();
  reused_ = std::move(cached);
  if (prefix_reuse_)
    for (size_t s = 0; s < requests.size(); ++s) {
      // The slot holds the prompt and every generated token fed back, all but the last.
      std::vector<int32_t> held = requests[s].prompt;
      if (!out[s].tokens.empty()) held.insert(held.end(), out[s].tokens.begin(), out[s].tokens.end() - 1);
      slot_tokens_.push_back(std::move(held));
    }
  return out;
}

void Generator::set_prefix_reuse(bool on) {
  prefix_reuse_ = on;
  slot_tokens_.clear();
}

std::vector<float> Generator::score(const std::vector<int32_t>& prompt) {
  GenerationRequest r{.prompt = prompt, .max_new_tokens = 0};
  check_request(r);
  slot_tokens_.clear();  // slot 0 is rewritten (the others are forgotten too: simpler, and only costs a prefill)
  const RunnerLimits& limits = group_.runner().limits();
  const int64_t chunk = std::min(limits.max_step_tokens, limits.max_logit_rows);
  const size_t vocab = static_cast<size_t>(group_.vocab_size());
  std::vector<float> all;
  all.reserve(prompt.size() * vocab);
  for (size_t begin = 0; begin < prompt.size(); begin += static_cast<size_t>(chunk)) {
    BatchDesc batch;
    size_t end = std::min(prompt.size(), begin + static_cast<size_t>(chunk));
    for (size_t p = begin; p < end; ++p) batch.add(prompt[p], 0, static_cast<int32_t>(p), true);
    const std::vector<float>& logits = group_.forward(batch);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace lockstep
