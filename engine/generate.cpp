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

std::vector<GenerationOutput> Generator::generate(const std::vector<GenerationRequest>& requests, bool keep_logits,
                                                  const TokenCallback& on_token) {
  const RunnerLimits& limits = group_.runner().limits();
  LS_REQUIRE(static_cast<int64_t>(requests.size()) <= limits.max_slots, ErrorKind::kInvalidArgument,
             "{} sequences exceed the batch limit of {}", requests.size(), limits.max_slots);
  for (const auto& r : requests) check_request(r);
  const int64_t vocab = group_.vocab_size();
  std::vector<GenerationOutput> out(requests.size());
  std::vector<Sampler> samplers;
  for (size_t i = 0; i < requests.size(); ++i) samplers.emplace_back(requests[i].sampling, i);

  // Without logits to keep, the ids are chosen where the logits are (on the
  // GPU), so no logits cross to the host: by argmax when every request is
  // greedy, else by the sample op. Kept logits come to the host, where the
  // CPU twin of the sample op chooses the same ids.
  const bool greedy = std::all_of(requests.begin(), requests.end(), [](const GenerationRequest& r) {
    return r.sampling.temperature == 0.0;
  });
  const TpGroup::Choice choice = greedy ? TpGroup::Choice::kGreedy : TpGroup::Choice::kSample;
  // Appends the chosen token (and its logits row) and reports it.
  auto append = [&](size_t seq, int32_t token, const float* row) {
    out[seq].tokens.push_back(token);
    if (row != nullptr) out[seq].logits.insert(out[seq].logits.end(), row, row + vocab);
    if (on_token) on_token(seq, token);
    const auto& stops = requests[seq].stop_ids;
    if (std::find(stops.begin(), stops.end(), token) != stops.end()) out[seq].stopped = true;
  };
  // The sampling settings of each row's token `ahead` tokens past those it has (greedy: none).
  auto settings = [&](const std::vector<size_t>& row_seq, uint64_t ahead) {
    std::vector<SampleRow> rows;
    if (!greedy)
      for (size_t seq : row_seq) rows.push_back(samplers[seq].settings(out[seq].tokens.size() + ahead));
    return rows;
  };
  // Runs the step and chooses the next token of each of its logit rows.
  auto run = [&](BatchDesc& batch, const std::vector<size_t>& row_seq) {
    if (!keep_logits) {
      batch.sample_rows = settings(row_seq, 0);
      group_.enqueue(batch, choice);
      const std::vector<int32_t>& ids = group_.take_chosen();
      for (size_t i = 0; i < row_seq.size(); ++i) append(row_seq[i], ids[i], nullptr);
      return;
    }
    const std::vector<float>& logits = group_.forward(batch);
    for (size_t i = 0; i < row_seq.size(); ++i) {
      const float* row = &logits[i * static_cast<size_t>(vocab)];
      append(row_seq[i], samplers[row_seq[i]].sample(row, vocab), row);
    }
  };
  auto finished = [&](size_t seq) {
    return out[seq].stopped || static_cast<int64_t>(out[seq].tokens.size()) >= requests[seq].max_new_tokens;
  };

  // Prefill: all prompts' tokens in steps of at most max_step_tokens; the
  // last token of each prompt asks for logits.
  std::vector<std::pair<size_t, int32_t>> pending;  // (seq, position)
  for (size_t s = 0; s < requests.size(); ++s)
    for (size_t p = 0; p < requests[s].prompt.size(); ++p) pending.emplace_back(s, static_cast<int32_t>(p));
  for (size_t begin = 0; begin < pending.size();) {
    BatchDesc batch;
    std::vector<size_t> row_seq;
    while (begin < pending.size() && batch.size() < limits.max_step_tokens &&
           static_cast<int64_t>(row_seq.size()) < limits.max_logit_rows) {
      auto [seq, pos] = pending[begin++];
      bool last = static_cast<size_t>(pos) + 1 == requests[seq].prompt.size();
      bool want = last && requests[seq].max_new_tokens > 0;
      batch.add(requests[seq].prompt[static_cast<size_t>(pos)], static_cast<int32_t>(seq), pos, want);
      if (want) row_seq.push_back(seq);
    }
    run(batch, row_seq);
  }

  // Decode: one token per unfinished sequence per step.
  auto unfinished = [&] {
    std::vector<size_t> row_seq;
    for (size_t s = 0; s < requests.size(); ++s)
      if (!finished(s)) row_seq.push_back(s);
    return row_seq;
  };
  auto decode_batch = [&](const std::vector<size_t>& row_seq) {
    BatchDesc batch;
    for (size_t s : row_seq)
      batch.add(out[s].tokens.back(), static_cast<int32_t>(s),
                static_cast<int32_t>(requests[s].prompt.size() + out[s].tokens.size() - 1), true);
    return batch;
  };
  if (keep_logits) {
    for (std::vector<size_t> row_seq = unfinished(); !row_seq.empty(); row_seq = unfinished()) {
      BatchDesc batch = decode_batch(row_seq);
      run(batch, row_seq);
    }
    return out;
  }
  // With the ids chosen on the device, the next step is queued before this
  // one's ids reach the host whenever it is sure to run as the synchronous
  // loop would run it: the same sequences (none reaches its token limit
  // with this step's token), each fed its chosen token on the device. When a
  // sequence stops on a stop id instead, the queued step is dropped, so the
  // steps and their batches, and with them the tokens, are those of the
  // synchronous loop.
  std::vector<size_t> row_seq = unfinished();
  if (!row_seq.empty()) {
    BatchDesc batch = decode_batch(row_seq);
    batch.sample_rows = settings(row_seq, 0);
    group_.enqueue(batch, choice);
  }
  while (!row_seq.empty()) {
    const bool ahead = overlap_steps_ && group_.can_enqueue_next() &&
                       std::all_of(row_seq.begin(), row_seq.end(), [&](size_t s) {
                         return static_cast<int64_t>(out[s].tokens.size()) + 1 < requests[s].max_new_tokens;
                       });
    if (ahead) group_.enqueue_next(settings(row_seq, 1));
    const std::vector<int32_t>& ids = group_.take_chosen();
    bool stopped = false;
    for (size_t i = 0; i < row_seq.size(); ++i) {
      append(row_seq[i], ids[i], nullptr);
      stopped = stopped || out[row_seq[i]].stopped;
    }
    if (ahead && !stopped) continue;  // the queued step is the next one
    if (ahead) group_.take_chosen();  // dropped
    row_seq = unfinished();
    if (row_seq.empty()) break;
    BatchDesc batch = decode_batch(row_seq);
    batch.sample_rows = settings(row_seq, 0);
    group_.enqueue(batch, choice);
  }
  return out;
}

std::vector<float> Generator::score(const std::vector<int32_t>& prompt) {
  GenerationRequest r{.prompt = prompt, .max_new_tokens = 0};
  check_request(r);
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
