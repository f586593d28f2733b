#include "engine/generate.h"

#include <algorithm>
#include <set>
#include <utility>

#include "common/error.h"

namespace lockstep {

Generator::Generator(TpGroup& group, bool overlap_steps) : group_(group), overlap_steps_(overlap_steps) {}

void Generator::check(const GenerationRequest& r) const {
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

struct Callbacks {
  const TokenCallback& on_token;
  const DoneCallback& on_done;
};

// One generate() call: the requests, their outputs so far and the steps
// that produce them. Continuous batching: requests take the free sequence
// slots (lowest first) in order, and a request that finishes frees its slot
// for the next. The first steps prefill the first requests' prompts; from
// the first decode step on, a step holds one token of every decoding
// sequence and prompt tokens of the requests admitted since (in order, up to
// the step's limits), so with no more requests than slots the steps are one
// prefill of all prompts, then decode steps. A request's tokens do not depend
// on which others share its steps, except through how a backend rounds
// products of other row counts (the CPU backend's do not depend on them).
class GenerationRun {
 public:
  // slot_tokens: what each slot's cache held before the run (empty: nothing
  // known); reuse: prefill only what no slot holds (Generator::set_prefix_reuse).
  GenerationRun(TpGroup& group, const std::vector<GenerationRequest>& requests, bool keep_logits,
                const Callbacks& callbacks, std::vector<std::vector<int32_t>> slot_tokens, bool reuse)
      : group_(group), requests_(requests), keep_logits_(keep_logits), callbacks_(callbacks), reuse_(reuse),
        out_(requests.size()), vocab_(group.vocab_size()), slot_(requests.size(), -1), fed_(requests.size(), 0),
        reused_(requests.size(), 0), pending_(requests.size()), slot_tokens_(std::move(slot_tokens)) {
    const auto slots = static_cast<size_t>(group.runner().limits().max_slots);
    slot_tokens_.resize(slots);
    occupant_.assign(slots, -1);
    for (size_t i = 0; i < requests.size(); ++i)
      samplers_.emplace_back(requests[i].sampling, requests[i].sampling_sequence >= 0
                                                       ? static_cast<uint64_t>(requests[i].sampling_sequence)
                                                       : i);
    for (size_t s = 0; s < slots; ++s) free_slots_.insert(static_cast<int32_t>(s));
    // Without logits to keep, the ids are chosen where the logits are (on
    // the GPU), so no logits cross to the host: by argmax when every request
    // is greedy, else by the sample op. Kept logits come to the host, where
    // the CPU twin of the sample op chooses the same ids.
    greedy_ = std::all_of(requests.begin(), requests.end(),
                          [](const GenerationRequest& r) { return r.sampling.temperature == 0.0; });
    choice_ = greedy_ ? TpGroup::Choice::kGreedy : TpGroup::Choice::kSample;
  }

  // Steps until every request is done. With the ids chosen on the device,
  // the next decode step is queued before this one's ids reach the host
  // whenever it is sure to run as the synchronous loop would run it: the
  // same sequences (none reaches its token limit with this step's token and
  // none is still prefilling), each fed its chosen token on the device. When
  // a sequence stops on a stop id (or its stops_after) instead, the queued
  // step is dropped, so the steps and their batches, and with them the
  // tokens, are those of the synchronous loop.
  void run(bool overlap_steps) {
    for (admit(); !active_.empty(); admit()) {
      Step step = next_step();
      if (keep_logits_) {
        run_keeping_logits(step);
      } else {
        step.batch.sample_rows = settings(step.row_seq, 0);
        group_.enqueue(step.batch, choice_);
        while (true) {
          const bool ahead = overlap_steps && may_queue_next(step.row_seq);
          if (ahead) group_.enqueue_next(settings(step.row_seq, 1));
          const bool stopped = take(step.row_seq);
          if (!ahead) break;
          if (!stopped) continue;  // the queued step is the next one
          group_.take_chosen();    // dropped
          break;
        }
      }
      retire();
    }
  }

  std::vector<GenerationOutput> result() { return std::move(out_); }
  const std::vector<int64_t>& reused() const { return reused_; }
  // What each slot's cache holds now (the next run's slot_tokens).
  std::vector<std::vector<int32_t>> slot_contents() const {
    std::vector<std::vector<int32_t>> held(slot_tokens_.size());
    for (size_t t = 0; t < held.size(); ++t)
      for (int32_t token; content_at(t, held[t].size(), false, token);) held[t].push_back(token);
    return held;
  }

 private:
  struct Step {
    BatchDesc batch;
    std::vector<size_t> row_seq;  // the request of each logit row
  };
  bool prefilling(size_t r) const { return fed_[r] < requests_[r].prompt.size(); }
  bool finished(size_t r) const {
    return !prefilling(r) &&
           (out_[r].stopped || static_cast<int64_t>(out_[r].tokens.size()) >= requests_[r].max_new_tokens);
  }
  // The token at `position` of slot t's cache, now or (planned) once its
  // request's prompt is in; false past its end. A slot holds its request's
  // prompt as far as fed, then every generated token fed back (all but the last).
  bool content_at(size_t t, size_t position, bool planned, int32_t& token) const {
    if (occupant_[t] < 0) {
      if (position >= slot_tokens_[t].size()) return false;
      token = slot_tokens_[t][position];
      return true;
    }
    const auto r = static_cast<size_t>(occupant_[t]);
    const std::vector<int32_t>& prompt = requests_[r].prompt;
    if (position < (planned ? prompt.size() : fed_[r])) {
      token = prompt[position];
      return true;
    }
    const size_t generated = position - prompt.size();
    if (prefilling(r) || position < prompt.size() || generated + 1 >= out_[r].tokens.size()) return false;
    token = out_[r].tokens[generated];
    return true;
  }
  // How many of the prompt's first tokens (all but its last, which runs for
  // its logits) slot t's cache holds, now or planned.
  size_t shared_prefix(const std::vector<int32_t>& prompt, size_t t, bool planned) const {
    size_t n = 0;
    for (int32_t token; n + 1 < prompt.size() && content_at(t, n, planned, token) && token == prompt[n];) ++n;
    return n;
  }
  // Waiting requests, in order, into the free slots (the lowest first). With
  // reuse, a request starts from the longest prefix of its prompt that a
  // slot holds: its own slot's in place, another's copied now, or another's
  // whose request is still prefilling it, copied once it is in (pending).
  void admit() {
    for (; next_waiting_ < requests_.size() && !free_slots_.empty(); ++next_waiting_) {
      const size_t r = next_waiting_;
      const int32_t s = *free_slots_.begin();
      free_slots_.erase(free_slots_.begin());
      const std::vector<int32_t>& prompt = requests_[r].prompt;
      size_t now = reuse_ ? shared_prefix(prompt, static_cast<size_t>(s), false) : 0;
      int32_t from = s;
      for (size_t t = 0; reuse_ && t < occupant_.size(); ++t) {
        if (t == static_cast<size_t>(s)) continue;
        const size_t held = shared_prefix(prompt, t, false), planned = shared_prefix(prompt, t, true);
        if (held > now) now = held, from = static_cast<int32_t>(t);
        if (planned > std::max(now, pending_[r].positions)) pending_[r] = {static_cast<int32_t>(t), planned};
      }
      if (pending_[r].positions <= now) pending_[r] = {};
      group_.runner().copy_kv_prefix(from, s, static_cast<int64_t>(now));
      occupant_[static_cast<size_t>(s)] = static_cast<int64_t>(r);
      slot_[r] = s;
      fed_[r] = reused_[r] = now;
      active_.push_back(r);
    }
  }
  // After a step: copies the pending prefixes whose slots hold them by now
  // (before those slots can change hands). A slot that will not hold one
  // after all leaves its request to prefill it.
  void copy_pending() {
    for (size_t r : active_) {
      Pending& p = pending_[r];
      if (p.positions == 0) continue;
      const auto from = static_cast<size_t>(p.from);
      if (shared_prefix(requests_[r].prompt, from, false) >= p.positions) {
        group_.runner().copy_kv_prefix(p.from, slot_[r], static_cast<int64_t>(p.positions));
        fed_[r] = reused_[r] = p.positions;
        p = {};
      } else if (shared_prefix(requests_[r].prompt, from, true) < p.positions) {
        p = {};
      }
    }
  }
  // After a step: pending copies, then finished requests give their slots
  // back and are reported.
  void retire() {
    copy_pending();
    for (size_t r : active_) {
      if (!finished(r)) continue;
      free_slots_.insert(slot_[r]);
      if (callbacks_.on_done) callbacks_.on_done(r, out_[r]);
    }
    std::erase_if(active_, [&](size_t r) { return finished(r); });
  }
  // One token of every decoding request, then prompt tokens of those
  // prefilling (the last of each prompt asks for logits) up to the step's
  // limits; until the first decode step, prompt tokens alone, so that the
  // requests of a first batch start decoding together.
  Step next_step() {
    const RunnerLimits& limits = group_.runner().limits();
    Step step;
    const bool prefill = std::any_of(active_.begin(), active_.end(), [&](size_t r) { return prefilling(r); });
    decoding_ = decoding_ || !prefill;
    // Every decoding request first: a request admitted before them may be
    // prefilling still (it waited for a prefix another slot was prefilling),
    // and its prompt tokens must not take their room.
    for (size_t r : active_) {
      if (!decoding_ || prefilling(r)) continue;
      step.batch.add(out_[r].tokens.back(), slot_[r],
                     static_cast<int32_t>(requests_[r].prompt.size() + out_[r].tokens.size() - 1), true);
      step.row_seq.push_back(r);
    }
    for (size_t r : active_) {
      const std::vector<int32_t>& prompt = requests_[r].prompt;
      for (; prefilling(r) && pending_[r].positions == 0 && step.batch.size() < limits.max_step_tokens &&
             static_cast<int64_t>(step.row_seq.size()) < limits.max_logit_rows;
           ++fed_[r]) {
        const bool want = fed_[r] + 1 == prompt.size() && requests_[r].max_new_tokens > 0;
        step.batch.add(prompt[fed_[r]], slot_[r], static_cast<int32_t>(fed_[r]), want);
        if (want) step.row_seq.push_back(r);
      }
    }
    return step;
  }
  // Whether the step after the one just queued is its batch fed back: every
  // active request has a row in it, and none reaches its limit with it.
  bool may_queue_next(const std::vector<size_t>& row_seq) const {
    return group_.can_enqueue_next() && row_seq.size() == active_.size() &&
           std::all_of(row_seq.begin(), row_seq.end(), [&](size_t r) {
             return !prefilling(r) && static_cast<int64_t>(out_[r].tokens.size()) + 1 < requests_[r].max_new_tokens;
           });
  }
  // Appends the chosen token (and its logits row), decides whether it ends
  // the request and reports it. The request's stops_after sees every token
  // (it may keep state), and before on_token, so that a caller streaming
  // text knows by then what the token completed.
  void append(size_t seq, int32_t token, const float* row) {
    LS_REQUIRE(token >= 0, ErrorKind::kModel,
               "request {}'s logits for new token {} hold a NaN or +inf, or nothing above -inf: the model's "
               "weights or config give non-finite values", seq, out_[seq].tokens.size());
    out_[seq].tokens.push_back(token);
    if (row != nullptr) out_[seq].logits.insert(out_[seq].logits.end(), row, row + vocab_);
    const GenerationRequest& r = requests_[seq];
    const bool stop_id = std::find(r.stop_ids.begin(), r.stop_ids.end(), token) != r.stop_ids.end();
    const bool hook = r.stops_after && r.stops_after(token);
    out_[seq].stopped = stop_id || hook;
    if (callbacks_.on_token) callbacks_.on_token(seq, token);
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
  // Runs the step and chooses each logit row's token on the host.
  void run_keeping_logits(const Step& step) {
    const std::vector<float>& logits = group_.forward(step.batch);
    for (size_t i = 0; i < step.row_seq.size(); ++i) {
      const float* row = &logits[i * static_cast<size_t>(vocab_)];
      append(step.row_seq[i], samplers_[step.row_seq[i]].sample(row, vocab_), row);
    }
  }

  TpGroup& group_;
  const std::vector<GenerationRequest>& requests_;
  bool keep_logits_;
  const Callbacks& callbacks_;
  bool reuse_;
  std::vector<GenerationOutput> out_;
  std::vector<Sampler> samplers_;
  int64_t vocab_;
  bool greedy_ = true;
  TpGroup::Choice choice_ = TpGroup::Choice::kGreedy;
  std::vector<int32_t> slot_;   // each request's sequence slot (-1: not admitted yet)
  std::vector<size_t> fed_;     // each request's prompt tokens in its slot's cache
  std::vector<int64_t> reused_;  // each request's prompt tokens it found in a cache
  struct Pending {
    int32_t from = 0;      // the slot whose request is prefilling them
    size_t positions = 0;  // 0: none
  };
  std::vector<Pending> pending_;  // per request: a prefix to copy once it is in
  std::vector<std::vector<int32_t>> slot_tokens_;  // per slot, before the run
  std::vector<int64_t> occupant_;  // per slot: the request that last took it in this run (-1: none)
  std::set<int32_t> free_slots_;
  std::vector<size_t> active_;  // admitted and not finished, in order
  size_t next_waiting_ = 0;
  bool decoding_ = false;  // a decode step has run: later prefills share their steps with decode rows
};

}  // namespace

std::vector<GenerationOutput> Generator::generate(const std::vector<GenerationRequest>& requests, bool keep_logits,
                                                  const TokenCallback& on_token, const DoneCallback& on_done) {
  for (const auto& r : requests) check(r);
  group_.drop_queued();
  // Nothing is claimed while the run writes (a failed run leaves the caches unknown).
  const Callbacks callbacks{.on_token = on_token, .on_done = on_done};
  GenerationRun run(group_, requests, keep_logits, callbacks, std::exchange(slot_tokens_, {}), prefix_reuse_);
  run.run(overlap_steps_);
  reused_ = run.reused();
  if (prefix_reuse_) slot_tokens_ = run.slot_contents();
  return run.result();
}

void Generator::set_prefix_reuse(bool on) {
  prefix_reuse_ = on;
  slot_tokens_.clear();
}

std::vector<float> Generator::score(const std::vector<int32_t>& prompt) {
  GenerationRequest r{.prompt = prompt, .max_new_tokens = 0};
  check(r);
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
