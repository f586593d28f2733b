// The decode-graph logic of TpGroup without a GPU: a backend that records
// ops between capture_begin and capture_end (parameters by value, as a CUDA
// graph bakes them) and replays the recording stands in for CUDA graphs. A
// graphed run must choose the same tokens and give bitwise the same logits
// as a plain run, which fails if anything a step needs changes on the host
// between replays instead of in backend memory.
#include <functional>
#include <map>

#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/model_writer.h"
#include "engine/runner.h"
#include "tests/test_support.h"
#include "tp/communicator.h"
#include "tp/group.h"

namespace lockstep {
namespace {

class RecordingBackend final : public Backend {
 public:
  std::string name() const override { return "recording"; }
  DType act_dtype() const override { return cpu_->act_dtype(); }
  DType weight_dtype() const override { return cpu_->weight_dtype(); }
  Buffer alloc(int64_t bytes) override { return cpu_->alloc(bytes); }
  void to_backend(void* dst, const void* src, int64_t bytes) override {
    EXPECT_FALSE(capturing_) << "host copy inside a captured step";
    cpu_->to_backend(dst, src, bytes);
  }
  void to_host(void* dst, const void* src, int64_t bytes) override {
    EXPECT_FALSE(capturing_) << "host copy inside a captured step";
    cpu_->to_host(dst, src, bytes);
  }
  void copy_within(void* dst, const void* src, int64_t bytes) override {
    EXPECT_FALSE(capturing_) << "cache copy inside a captured step";
    cpu_->copy_within(dst, src, bytes);
  }
  Buffer alloc_host_visible(int64_t bytes) override { return cpu_->alloc_host_visible(bytes); }
  double copy_bandwidth_gbs(int64_t bytes) override { return cpu_->copy_bandwidth_gbs(bytes); }
  int64_t memory_used_bytes() const override { return cpu_->memory_used_bytes(); }
  void synchronize() override {}
  // Counts the steps marked and not yet waited for (queued steps).
  void record_event(int) override { max_queued = std::max(max_queued, ++queued_); }
  void wait_event(int) override { --queued_; }

  void embedding(const EmbeddingParams& p) override { op([this, p] { cpu_->embedding(p); }); }
  void linear(const LinearParams& p) override { op([this, p] { cpu_->linear(p); }); }
  void attention(const AttentionParams& p) override { op([this, p] { cpu_->attention(p); }); }
  void argmax(const ArgmaxParams& p) override { op([this, p] { cpu_->argmax(p); }); }
  void sample(const SampleParams& p) override { op([this, p] { cpu_->sample(p); }); }
  void next_tokens(const NextTokensParams& p) override { op([this, p] { cpu_->next_tokens(p); }); }

  bool supports_graphs() const override { return true; }
  void capture_begin() override {
    capturing_ = true;
    recording_.clear();
  }
  void capture_end(int64_t id) override {
    capturing_ = false;
    graphs_[id] = std::move(recording_);
    ++captures;
  }
  void replay(int64_t id) override {
    for (auto& f : graphs_.at(id)) f();
    ++replays;
  }
  int captures = 0;
  int replays = 0;
  int max_queued = 0;

 private:
  int queued_ = 0;
  template <typename F>
  void op(F f) {
    if (capturing_)
      recording_.push_back(f);
    else
      f();
  }
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
  bool capturing_ = false;
  std::vector<std::function<void()>> recording_;
  std::map<int64_t, std::vector<std::function<void()>>> graphs_;
};

struct GenerateRun {
  std::vector<GenerationOutput> out;
  int captures = 0;
  int replays = 0;
  int max_queued = 0;
};

class GraphReplayTest : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    MakeModelOptions o{.shape = model_preset("tiny", Arch::kLlama), .dtype = DType::kF32, .seed = 7, .out = dir_};
    write_random_model(o);
  }

  // Three sequences of different prompt lengths (a batch of 3 pads to the
  // bucket of 4, then 2 as they finish), greedy or sampled, keeping the
  // logits or not.
  GenerateRun generate(bool graphs, bool keep_logits, bool sampled, bool overlap_steps = true,
                       const std::vector<int32_t>& stop_ids = {}) {
    const ModelConfig config = load_model_config(dir_);
    const ShardPlan plan = ShardPlan::make(config, 0, 1);
    auto comm = make_single_rank_communicator();
    TensorStore store(dir_);
    std::unique_ptr<Backend> backend =
        graphs ? std::unique_ptr<Backend>(std::make_unique<RecordingBackend>()) : make_cpu_backend();
    ModelWeights weights = load_weights(store, config, plan, *comm, *backend, nullptr);
    const RunnerLimits limits{.max_slots = 4, .max_seq = 64, .max_step_tokens = 16, .max_logit_rows = 4};
    Runner runner(config, plan, std::move(weights), *backend, limits, Diagnostics{});
    TpGroup group(*comm, runner, graphs);
    Generator gen(group, overlap_steps);
    std::vector<GenerationRequest> requests{{.prompt = {1, 2, 3}, .max_new_tokens = 9},
                                            {.prompt = {4, 5, 6, 7, 8}, .max_new_tokens = 12},
                                            {.prompt = {9}, .max_new_tokens = 5}};
    for (auto& r : requests) r.stop_ids = stop_ids;
    if (sampled) {
      requests[0].sampling = SamplingParams{.temperature = 0.9, .top_k = 30, .seed = 5};
      requests[2].sampling = SamplingParams{.temperature = 1.2, .top_p = 0.8, .seed = 6};
    }
    GenerateRun run{.out = gen.generate(requests, keep_logits)};
    if (graphs) {
      auto& rec = static_cast<RecordingBackend&>(*backend);
      run.captures = rec.captures;
      run.replays = rec.replays;
      run.max_queued = rec.max_queued;
    }
    return run;
  }

  // A runner on the CPU backend over the fixture's model (the fixture owns it).
  Runner& cpu_runner(const RunnerLimits& limits) {
    const ModelConfig config = load_model_config(dir_);
    const ShardPlan plan = ShardPlan::make(config, 0, 1);
    comm_ = make_single_rank_communicator();
    backend_ = make_cpu_backend();
    TensorStore store(dir_);
    ModelWeights weights = load_weights(store, config, plan, *comm_, *backend_, nullptr);
    runner_ = std::make_unique<Runner>(config, plan, std::move(weights), *backend_, limits, Diagnostics{});
    return *runner_;
  }
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Runner> runner_;
};

TEST_F(GraphReplayTest, GraphedDecodeMatchesPlainDecode) {
  for (auto [keep_logits, sampled] : {std::pair{false, false}, {true, false}, {false, true}, {true, true}}) {
    const GenerateRun plain = generate(false, keep_logits, sampled, false);
    const GenerateRun graphed = generate(true, keep_logits, sampled);
    ASSERT_EQ(plain.out.size(), graphed.out.size());
    for (size_t i = 0; i < plain.out.size(); ++i) {
      EXPECT_EQ(plain.out[i].tokens, graphed.out[i].tokens)
          << "sequence " << i << " keep_logits " << keep_logits << " sampled " << sampled;
      EXPECT_EQ(plain.out[i].logits, graphed.out[i].logits) << "sequence " << i;
    }
    // 11 decode steps: 4 with 3 sequences (bucket 4), 4 with 2, 3 with 1.
    // Each bucket's first step runs eagerly and its second is captured, and
    // every step from the second on is a replay: 3 + 3 + 2.
    EXPECT_EQ(graphed.captures, 3) << "buckets 4, 2 and 1 are each captured once";
    EXPECT_EQ(graphed.replays, 8);
    // Without kept logits the next step is queued before the last one's tokens are taken.
    EXPECT_EQ(graphed.max_queued, keep_logits ? 0 : 2);
  }
}

// Queued steps (a step queued before the last one's tokens reach the host,
// its tokens fed back on the backend) choose what one step at a time
// chooses, also when sequences end on stop ids and the queued step is
// dropped, and with graphs replaying the fed-back steps.
TEST_F(GraphReplayTest, QueuedStepsChooseWhatOneStepAtATimeChooses) {
  for (bool sampled : {false, true}) {
    const GenerateRun free_run = generate(false, false, sampled, false);
    // Stop ids from the middle of two sequences' free runs.
    const std::vector<int32_t> stops{free_run.out[0].tokens[4], free_run.out[1].tokens[7]};
    for (const std::vector<int32_t>& stop_ids : {std::vector<int32_t>{}, stops}) {
      const GenerateRun one_at_a_time = generate(false, false, sampled, false, stop_ids);
      for (bool graphs : {false, true}) {
        const GenerateRun queued = generate(graphs, false, sampled, true, stop_ids);
        for (size_t i = 0; i < one_at_a_time.out.size(); ++i) {
          EXPECT_EQ(queued.out[i].tokens, one_at_a_time.out[i].tokens)
              << "sequence " << i << " sampled " << sampled << " graphs " << graphs << " stops " << stop_ids.size();
          EXPECT_EQ(queued.out[i].stopped, one_at_a_time.out[i].stopped) << "sequence " << i;
        }
        if (graphs) {
          EXPECT_EQ(queued.max_queued, 2);
        }
      }
      if (!stop_ids.empty()) {
        EXPECT_TRUE(one_at_a_time.out[0].stopped || one_at_a_time.out[1].stopped);
      }
    }
  }
}

// A fed-back step past the context's end is refused on the host before it
// is queued, with the position and the context length named.
TEST_F(GraphReplayTest, QueuedStepPastTheContextIsRefused) {
  Runner& runner = cpu_runner({.max_slots = 2, .max_seq = 8, .max_step_tokens = 8, .max_logit_rows = 2});
  TpGroup group(*comm_, runner, false);
  BatchDesc b;
  b.add(3, 0, 6, true);
  b.add(4, 1, 2, true);
  group.enqueue(b, TpGroup::Choice::kGreedy);
  ASSERT_TRUE(group.can_enqueue_next());
  group.enqueue_next({});  // positions 7 and 3
  group.take_chosen();
  group.take_chosen();
  try {
    group.enqueue_next({});
    ADD_FAILURE() << "a step at position 8 of 8 was queued";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 8 is beyond the context length 8"), std::string::npos) << e.what();
  }
  // A prompt chunk (two tokens of one sequence) does not feed back.
  BatchDesc chunk;
  chunk.add(3, 0, 0, true);
  chunk.add(4, 0, 1, true);
  group.enqueue(chunk, TpGroup::Choice::kGreedy);
  group.take_chosen();
  EXPECT_FALSE(group.can_enqueue_next());
  // A step left queued (a caller that ended midway) does not hold up the next generate call.
  group.enqueue(b, TpGroup::Choice::kGreedy);
  group.enqueue_next({});
  const std::vector<GenerationOutput> out = Generator(group).generate({{.prompt = {1, 2}, .max_new_tokens = 3}}, false);
  EXPECT_EQ(out[0].tokens.size(), 3u);
}

// AttentionParams::no_lower_writes, which a captured step bakes in and the
// graphs are keyed by: true only when no token sits above another token of
// its slot (decode, padding rows at position 0), false for prompt chunks.
TEST_F(GraphReplayTest, NoLowerWritesOnlyWhenNoTokenSitsAboveAnotherOfItsSlot) {
  Runner& runner = cpu_runner({.max_slots = 4, .max_seq = 64, .max_step_tokens = 16, .max_logit_rows = 4});
  struct Token {
    int32_t slot, position;
  };
  auto no_lower_writes = [&](const std::vector<Token>& tokens) {
    BatchDesc b;
    for (const Token& t : tokens) b.add(1, t.slot, t.position, true);
    runner.set_batch(b);
    return runner.batch_no_lower_writes();
  };
  EXPECT_TRUE(no_lower_writes({{0, 5}, {1, 9}, {3, 0}}));  // decode: one token per slot
  const int32_t pad = runner.padding_slot();
  EXPECT_TRUE(no_lower_writes({{2, 7}, {pad, 0}, {pad, 0}, {pad, 0}}));  // padding rows share position 0
  EXPECT_FALSE(no_lower_writes({{0, 5}, {0, 6}}));                       // a prompt chunk
  EXPECT_FALSE(no_lower_writes({{0, 6}, {1, 3}, {0, 5}}));               // a lower token of slot 0 later on
  EXPECT_TRUE(no_lower_writes({{0, 6}}));
}

}  // namespace
}  // namespace lockstep
