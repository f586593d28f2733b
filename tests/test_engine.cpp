// The one layer sequence serves every path: a batch of several sequences,
// chunked prefill and one-shot prefill give the same results as one sequence
// at a time (bit for bit on the CPU backend, whose ops are row-independent).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <set>

#include "cli_support.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "test_support.h"

namespace lockstep {
namespace {

using namespace testing_cli;

class EngineTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    model_ = dir_ / "model";
    CommandResult r = run(lockstep("make-model --arch qwen2 --preset tiny --out " + model_.string()), dir_ / "mk");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    comm_ = make_single_rank_communicator();
  }
  std::unique_ptr<Engine> engine(int64_t max_batch, int64_t step_tokens) {
    EngineOptions o;
    o.model_dir = model_;
    o.max_batch = max_batch;
    o.max_step_tokens = step_tokens;
    return std::make_unique<Engine>(o, *comm_);
  }
  static std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back((i * 37 + salt * 101) % 500);
    return p;
  }
  std::filesystem::path model_;
  std::unique_ptr<Communicator> comm_;
};

TEST_F(EngineTest, BatchOfSequencesEqualsOneAtATime) {
  std::vector<GenerationRequest> requests;
  for (int s = 0; s < 3; ++s) requests.push_back({.prompt = prompt(3 + 5 * s, s), .max_new_tokens = 4 + 2 * s});
  requests[1].sampling = SamplingParams{.temperature = 0.7, .top_k = 20, .seed = 9};
  auto batched_engine = engine(3, 256);
  Generator batched(batched_engine->group());
  std::vector<GenerationOutput> together = batched.generate(requests, true);
  for (size_t s = 0; s < requests.size(); ++s) {
    auto single_engine = engine(1, 256);
    Generator single(single_engine->group());
    GenerationRequest alone = requests[s];
    std::vector<GenerationOutput> one = single.generate({alone}, true);
    // Sequence s samples from stream s when batched, stream 0 alone: compare greedy ones exactly.
    if (alone.sampling.temperature == 0.0) {
      EXPECT_EQ(together[s].tokens, one[0].tokens) << "sequence " << s;
      EXPECT_EQ(together[s].logits, one[0].logits) << "sequence " << s;
    } else {
      EXPECT_EQ(together[s].tokens.size(), one[0].tokens.size());
    }
  }
}

TEST_F(EngineTest, ChunkedPrefillEqualsOneShot) {
  const std::vector<int32_t> p = prompt(150, 4);
  auto one_shot = engine(1, 256), chunked = engine(1, 16);
  Generator a(one_shot->group()), b(chunked->group());
  GenerationRequest r{.prompt = p, .max_new_tokens = 5};
  auto x = a.generate({r}, true), y = b.generate({r}, true);
  EXPECT_EQ(x[0].tokens, y[0].tokens);
  EXPECT_EQ(x[0].logits, y[0].logits);
  // Greedy without logits (the backend's argmax path) picks the same ids,
  // including over prefill chunks that return no rows.
  auto chunked_greedy = engine(1, 16);
  Generator c(chunked_greedy->group());
  EXPECT_EQ(c.generate({r}, false)[0].tokens, x[0].tokens);
  // score (chunked by the logit-row limit) agrees with generate's first row.
  std::vector<float> scored = a.score(p);
  const size_t vocab = 512;
  std::vector<float> last(scored.end() - static_cast<long>(vocab), scored.end());
  std::vector<float> first(x[0].logits.begin(), x[0].logits.begin() + static_cast<long>(vocab));
  EXPECT_EQ(last, first);
}

// Sampling on the backend (logits not kept) and by the CPU twin on the host
// (logits kept) choose the same tokens: the same rule and the same random
// bits per (seed, sequence, step).
TEST_F(EngineTest, SampledTokensDoNotDependOnKeptLogits) {
  std::vector<GenerationRequest> requests;
  for (int s = 0; s < 4; ++s) requests.push_back({.prompt = prompt(3 + 4 * s, s), .max_new_tokens = 6 + s});
  requests[0].sampling = SamplingParams{.temperature = 1.0, .seed = 1};
  requests[1].sampling = SamplingParams{.temperature = 0.8, .top_k = 20, .seed = 2};
  requests[2].sampling = SamplingParams{.temperature = 1.3, .top_k = 50, .top_p = 0.7, .seed = 3};
  // requests[3] stays greedy: a greedy row in a sampled step.
  auto a = engine(4, 256), b = engine(4, 16);  // b: chunked prefill too
  const std::vector<GenerationOutput> kept = Generator(a->group()).generate(requests, true);
  const std::vector<GenerationOutput> not_kept = Generator(b->group()).generate(requests, false);
  std::set<int32_t> distinct;
  for (size_t s = 0; s < requests.size(); ++s) {
    EXPECT_EQ(kept[s].tokens, not_kept[s].tokens) << "sequence " << s;
    distinct.insert(kept[s].tokens.begin(), kept[s].tokens.end());
  }
  EXPECT_GT(distinct.size(), 8u) << "sampling should spread over the vocabulary";
}

TEST_F(EngineTest, StopIdEndsGenerationAndIsEmitted) {
  auto e = engine(1, 256);
  Generator g(e->group());
  GenerationRequest r{.prompt = prompt(5, 1), .max_new_tokens = 6};
  auto free_run = g.generate({r}, false);
  ASSERT_EQ(free_run[0].tokens.size(), 6u);
  auto e2 = engine(1, 256);
  Generator g2(e2->group());
  r.stop_ids = {free_run[0].tokens[2]};
  auto stopped = g2.generate({r}, false);
  // Generation ends at the first occurrence of the stop id, which is emitted.
  size_t first = std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), r.stop_ids[0]) -
                 free_run[0].tokens.begin();
  EXPECT_TRUE(stopped[0].stopped);
  EXPECT_EQ(stopped[0].tokens, std::vector<int32_t>(free_run[0].tokens.begin(),
                                                     free_run[0].tokens.begin() + static_cast<long>(first) + 1));
}

// A request's stops_after ends it with the token it returns true for, in
// that token's step, as a stop id does: its tokens end there, the hook saw
// each of them once and in order, and with steps queued ahead the one queued
// past the stop is dropped (the requests sharing its steps, and those that
// take the freed slots, get the tokens they get alone). Each hook here ends
// its request on a pair of tokens of its free run, as a stop string that
// spans two tokens would.
TEST_F(EngineTest, StopsAfterEndsARequestInItsStep) {
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 5; ++r)
    requests.push_back({.prompt = prompt(3 + 4 * r, 20 + r), .max_new_tokens = 8, .sampling_sequence = r});
  requests[2].sampling = SamplingParams{.temperature = 0.9, .seed = 3};
  std::vector<std::vector<int32_t>> free_run, expected;
  for (const GenerationRequest& r : requests) {
    auto e = engine(1, 256);
    free_run.push_back(Generator(e->group()).generate({r}, false)[0].tokens);
    ASSERT_EQ(free_run.back().size(), 8u);
  }
  std::vector<std::vector<int32_t>> seen(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    // Request 4 never meets its pair and runs to its token limit.
    const std::pair<int32_t, int32_t> pair =
        r == 4 ? std::make_pair(-1, -1) : std::make_pair(free_run[r][1 + r], free_run[r][2 + r]);
    size_t end = 1;
    while (end < 8 && !(free_run[r][end - 1] == pair.first && free_run[r][end] == pair.second)) ++end;
    const auto kept = static_cast<long>(std::min<size_t>(end + 1, 8));
    expected.push_back(std::vector<int32_t>(free_run[r].begin(), free_run[r].begin() + kept));
    requests[r].stops_after = [&seen, r, pair](int32_t token) {
      std::vector<int32_t>& tokens = seen[r];
      tokens.push_back(token);
      return tokens.size() >= 2 && tokens[tokens.size() - 2] == pair.first && tokens.back() == pair.second;
    };
  }
  for (size_t r = 0; r < 4; ++r) ASSERT_LT(expected[r].size(), 8u);
  for (const bool keep_logits : {true, false})
    for (const bool overlap : {true, false}) {
      for (auto& tokens : seen) tokens.clear();
      auto two_slots = engine(2, 16);
      const std::vector<GenerationOutput> out = Generator(two_slots->group(), overlap).generate(requests, keep_logits);
      for (size_t r = 0; r < requests.size(); ++r) {
        const std::string where = "request " + std::to_string(r) + " keep_logits " + std::to_string(keep_logits) +
                                  " overlap " + std::to_string(overlap);
        EXPECT_EQ(out[r].tokens, expected[r]) << where;
        EXPECT_EQ(seen[r], out[r].tokens) << where;
        EXPECT_EQ(out[r].stopped, r != 4) << where;
      }
    }
}

// Prefix reuse: a request prefills only what follows the tokens its slot's
// cache holds from the call before, with the tokens and logits of a whole
// prefill (bit for bit: the CPU backend's ops do not depend on the batch).
TEST_F(EngineTest, PrefixReuseEqualsWholePrefill) {
  auto reusing = engine(2, 16);  // chunked, so reused prefixes end inside and at chunk edges
  Generator g(reusing->group());
  g.set_prefix_reuse(true);
  const auto whole = [&](const std::vector<GenerationRequest>& requests, bool keep_logits) {
    auto fresh = engine(2, 16);
    return Generator(fresh->group()).generate(requests, keep_logits);
  };
  const auto expect_whole = [&](const std::vector<GenerationRequest>& requests, bool keep_logits,
                                const std::vector<int64_t>& reused) {
    const std::vector<GenerationOutput> got = g.generate(requests, keep_logits), want = whole(requests, keep_logits);
    EXPECT_EQ(g.reused_prompt_tokens(), reused);
    for (size_t s = 0; s < requests.size(); ++s) {
      EXPECT_EQ(got[s].tokens, want[s].tokens) << "sequence " << s;
      EXPECT_EQ(got[s].logits, want[s].logits) << "sequence " << s;
    }
    return got;
  };
  GenerationRequest a{.prompt = prompt(21, 1), .max_new_tokens = 5};
  GenerationRequest b{.prompt = prompt(9, 2), .max_new_tokens = 4, .sampling = {.temperature = 0.9, .seed = 5}};
  std::vector<GenerationOutput> first = expect_whole({a, b}, true, {0, 0});
  // The next turn: the prompt, the reply and more. The slot holds every reply token but the last.
  GenerationRequest a2 = a, b2 = b;
  a2.prompt.insert(a2.prompt.end(), first[0].tokens.begin(), first[0].tokens.end());
  a2.prompt.insert(a2.prompt.end(), {7, 8, 9});
  b2.prompt.insert(b2.prompt.end(), first[1].tokens.begin(), first[1].tokens.end());
  expect_whole({a2, b2}, false, {21 + 4, 9 + 3});
  // A prompt that leaves the cached tokens midway; one the cache holds whole
  // (its last token still runs, for its logits); one slot of two in use.
  GenerationRequest a3{.prompt = std::vector<int32_t>(a2.prompt.begin(), a2.prompt.begin() + 11), .max_new_tokens = 3};
  a3.prompt.insert(a3.prompt.end(), {1, 2, 3, 4});
  expect_whole({a3, b2}, true, {11, static_cast<int64_t>(b2.prompt.size()) - 1});
  expect_whole({a3}, true, {14});
  // score() writes slot 0 from position 0: nothing is reused after it.
  g.score(prompt(5, 3));
  expect_whole({a3}, true, {0});
  // Off: every prompt is prefilled whole.
  g.set_prefix_reuse(false);
  expect_whole({a3}, true, {0});
  expect_whole({a3}, true, {0});
}

// Prompts that share a prefix: a request admitted beside the one prefilling
// it waits and copies it once it is in; later ones copy what a slot holds or
// reuse their own slot's. Each request's tokens and logits are those it gets
// alone.
TEST_F(EngineTest, SharedPrefixesAreCopiedBetweenSlots) {
  const std::vector<int32_t> shared = prompt(30, 7);
  const auto with = [&](size_t n, std::vector<int32_t> tail) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + static_cast<long>(n));
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  std::vector<GenerationRequest> requests = {
      {.prompt = with(30, {1, 2}), .max_new_tokens = 3},  // slot 0, prefilled whole
      {.prompt = with(30, {3}), .max_new_tokens = 6},     // slot 1: waits for slot 0's 30
      {.prompt = with(10, {5, 6, 7}), .max_new_tokens = 2, .sampling = {.temperature = 0.9, .seed = 2}},
      {.prompt = with(30, {1, 2}), .max_new_tokens = 4},  // as request 0
      {.prompt = prompt(5, 9), .max_new_tokens = 2},      // nothing shared
      {.prompt = shared, .max_new_tokens = 3},
  };
  for (size_t r = 0; r < requests.size(); ++r) requests[r].sampling_sequence = static_cast<int64_t>(r);
  std::vector<GenerationOutput> alone;
  for (const GenerationRequest& r : requests) {
    auto e = engine(1, 256);
    alone.push_back(Generator(e->group()).generate({r}, true)[0]);
  }
  for (const bool keep_logits : {true, false}) {
    auto two_slots = engine(2, 16);
    Generator g(two_slots->group());
    g.set_prefix_reuse(true);
    const std::vector<GenerationOutput> out = g.generate(requests, keep_logits);
    for (size_t r = 0; r < requests.size(); ++r) {
      EXPECT_EQ(out[r].tokens, alone[r].tokens) << "request " << r << " keep_logits " << keep_logits;
      if (keep_logits) {
        EXPECT_EQ(out[r].logits, alone[r].logits) << "request " << r;
      }
    }
    // 0 in slot 0 and 1 in slot 1 (30 copied from slot 0); 0 ends first and
    // 2 takes slot 0 (10 in place); 1 ends and 3 takes slot 1 (its 30 plus
    // nothing more: slot 0 now holds 2's tokens past 10); 2 ends and 4 takes
    // slot 0 (nothing); 3 ends and 5 takes slot 1 (29 in place: all but its last).
    EXPECT_EQ(g.reused_prompt_tokens(), (std::vector<int64_t>{0, 30, 10, 30, 0, 29}));
  }
  // The request prefilling a prefix ends with its first token, and a waiting
  // one takes its slot at once: the prefix is copied before the slot changes hands.
  requests = {{.prompt = with(30, {1}), .max_new_tokens = 1},
              {.prompt = with(30, {2}), .max_new_tokens = 3},
              {.prompt = prompt(20, 11), .max_new_tokens = 2}};
  auto two_slots = engine(2, 16);
  Generator g(two_slots->group());
  g.set_prefix_reuse(true);
  const std::vector<GenerationOutput> out = g.generate(requests, false);
  EXPECT_EQ(g.reused_prompt_tokens(), (std::vector<int64_t>{0, 30, 0}));
  for (size_t r = 0; r < requests.size(); ++r) {
    auto e = engine(1, 256);
    EXPECT_EQ(out[r].tokens, Generator(e->group()).generate({requests[r]}, false)[0].tokens) << "request " << r;
  }
}

// A decode step holds a token of every slot, so the step limit is widened
// to the batch limit (here 12 slots against 8 tokens a step).
TEST_F(EngineTest, DecodeStepsHoldEverySlotPastTheStepTokenLimit) {
  auto e = engine(12, 8);
  EXPECT_EQ(e->group().runner().limits().max_step_tokens, 12);
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 12; ++r) requests.push_back({.prompt = prompt(3, r), .max_new_tokens = 3});
  const std::vector<GenerationOutput> out = Generator(e->group()).generate(requests, false);
  for (const GenerationOutput& o : out) EXPECT_EQ(o.tokens.size(), 3u);
}

// Continuous batching: more requests than slots, each taking a slot as one
// frees up, give each request the tokens and logits it gets alone.
TEST_F(EngineTest, MoreRequestsThanSlotsEqualOneAtATime) {
  std::vector<GenerationRequest> requests;
  for (int r = 0; r < 6; ++r)
    requests.push_back({.prompt = prompt(2 + 7 * r, r), .max_new_tokens = 9 - r, .sampling_sequence = r});
  requests[1].sampling = SamplingParams{.temperature = 0.8, .top_k = 30, .seed = 4};
  requests[3].max_new_tokens = 0;  // prefill only
  requests[4].sampling = SamplingParams{.temperature = 1.1, .seed = 6};
  std::vector<std::vector<GenerationOutput>> alone;
  for (const GenerationRequest& r : requests) {
    auto e = engine(1, 256);
    alone.push_back(Generator(e->group()).generate({r}, true));
  }
  // A stop id that ends request 2 early, freeing its slot sooner.
  ASSERT_GE(alone[2][0].tokens.size(), 3u);
  requests[2].stop_ids = {alone[2][0].tokens[1]};
  auto e = engine(1, 256);
  alone[2] = Generator(e->group()).generate({requests[2]}, true);
  ASSERT_TRUE(alone[2][0].stopped);
  for (const bool keep_logits : {true, false})
    for (const bool overlap : {true, false}) {
      auto two_slots = engine(2, 16);
      Generator g(two_slots->group(), overlap);
      g.set_prefix_reuse(true);
      std::vector<int> reported(requests.size(), 0);
      std::vector<std::vector<int32_t>> reported_tokens(requests.size());
      const std::vector<GenerationOutput> out =
          g.generate(requests, keep_logits, nullptr, [&](size_t r, const GenerationOutput& o) {
            ++reported[r];
            reported_tokens[r] = o.tokens;
          });
      EXPECT_EQ(reported, std::vector<int>(requests.size(), 1));  // each request reported once, when done
      for (size_t r = 0; r < requests.size(); ++r) EXPECT_EQ(reported_tokens[r], out[r].tokens) << "request " << r;
      EXPECT_EQ(g.reused_prompt_tokens(), std::vector<int64_t>(requests.size(), 0));
      for (size_t r = 0; r < requests.size(); ++r) {
        EXPECT_EQ(out[r].tokens, alone[r][0].tokens) << "request " << r << " keep_logits " << keep_logits;
        EXPECT_EQ(out[r].stopped, alone[r][0].stopped) << "request " << r;
        if (keep_logits) {
          EXPECT_EQ(out[r].logits, alone[r][0].logits) << "request " << r;
        }
      }
    }
}

// The cache reaches max_position_embeddings, with or without a sliding
// window; a longer one is refused with the reason.
TEST(MaxSeqLen, PositionLimitCapsTheCache) {
  ModelConfig c;
  c.hidden_size = 64, c.intermediate_size = 96, c.vocab_size = 384;
  c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16;
  c.max_position_embeddings = 256, c.sliding_window = 64;
  const ShardPlan plan = ShardPlan::make(c, 0, 1);
  EngineOptions o;
  o.max_batch = 1, o.kv_cache_bytes = 1 << 30;
  EXPECT_EQ(resolve_max_seq_len(c, plan, o, 2, 0), 256);  // the window caps nothing
  o.max_seq_len = 65;
  EXPECT_EQ(resolve_max_seq_len(c, plan, o, 2, 0), 65);
  c.sliding_window = 0;
  o.max_seq_len = 257;
  expect_error([&] { resolve_max_seq_len(c, plan, o, 2, 0); }, ErrorKind::kInvalidArgument,
               {"--max-seq-len 257", "max_position_embeddings 256"});
  o.max_seq_len = 0;
  EXPECT_EQ(resolve_max_seq_len(c, plan, o, 2, 0), 256);
}

// Without --kv-cache-bytes the backend's budget (the caller's default) caps
// the cache; a requested length over it is refused, naming the budget.
TEST(MaxSeqLen, DefaultBudgetCapsTheCache) {
  ModelConfig c;
  c.hidden_size = 64, c.intermediate_size = 96, c.vocab_size = 384;
  c.num_layers = 2, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16;
  c.max_position_embeddings = 256;
  const ShardPlan plan = ShardPlan::make(c, 0, 1);
  EngineOptions o;
  const int64_t per_position = 2 * 2 * 1 * 2 * 16 * 2;  // K and V, layers, slots, kv heads, head_dim, bytes
  EXPECT_EQ(resolve_max_seq_len(c, plan, o, 2, 100 * per_position + 5), 100);
  o.max_seq_len = 101;
  expect_error([&] { resolve_max_seq_len(c, plan, o, 2, 100 * per_position); }, ErrorKind::kInvalidArgument,
               {"--max-seq-len 101", "over the budget"});
  o.kv_cache_bytes = 200 * per_position;  // an explicit budget wins over the default
  EXPECT_EQ(resolve_max_seq_len(c, plan, o, 2, 100 * per_position), 101);
}

// The CPU backend splits large copies over its threads: the bytes are those
// of one memcpy, an overlapping copy (memmove) too; weights of 2 MiB or more
// start on a huge page's boundary; the bench's measurements return something.
// The host memory the checks count on: MemAvailable (a positive amount no
// larger than the machine), and a KV-cache default within it.
TEST(CpuBackend, MemoryBudgetsStayWithinTheHost) {
  auto be = make_cpu_backend();
  const int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  const int64_t free_bytes = be->free_memory_bytes();
  EXPECT_GT(free_bytes, 0);
  EXPECT_LE(free_bytes, phys);
  EXPECT_GT(be->default_kv_cache_bytes(1), 0);
  EXPECT_LE(be->default_kv_cache_bytes(1), std::min(phys / 4, free_bytes + (int64_t{64} << 20)));  // 64 MiB: the host moves
  EXPECT_LE(be->default_kv_cache_bytes(4), be->default_kv_cache_bytes(1) / 4 + (int64_t{16} << 20));
}

TEST(CpuBackend, LargeCopiesAreExactAndMeasured) {
  auto be = make_cpu_backend();
  const int64_t bytes = (int64_t{3} << 20) + 5;  // several chunks and a ragged end
  Buffer a = be->alloc(bytes + 4096), b = be->alloc(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(be->alloc_weights(bytes).data()) % (size_t{2} << 20), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(be->alloc_weights(100).data()) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  for (int64_t i = 0; i < bytes + 4096; ++i) a.as<uint8_t>()[i] = static_cast<uint8_t>(i * 131 + i / 977);
  be->copy_within(b.data(), a.data(), bytes);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(bytes)), 0);
  std::vector<uint8_t> expected(a.as<uint8_t>(), a.as<uint8_t>() + bytes + 4096);
  std::memmove(expected.data() + 4096, expected.data(), static_cast<size_t>(bytes));
  be->copy_within(a.as<uint8_t>() + 4096, a.data(), bytes);  // overlapping
  EXPECT_EQ(std::memcmp(a.data(), expected.data(), expected.size()), 0);
  EXPECT_GT(be->copy_bandwidth_gbs(int64_t{4} << 20), 0.0);
  EXPECT_GT(be->memory_used_bytes(), bytes);
}

}  // namespace
}  // namespace lockstep
