// Tensor parallelism on CPU ranks: TP=N against TP=1, each rank reading only
// its share of the sharded bytes, the replicated-weight checksum, and faults.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>

#include "cli_support.h"
#include "fault_support.h"
#include "engine/backend.h"
#include "engine/config.h"
#include "engine/io/npy.h"
#include "engine/io/safetensors.h"
#include "engine/weights.h"
#include "test_support.h"
#include "tp/communicator.h"
#include "tp/sharding.h"

namespace lockstep {
namespace {

using namespace testing_cli;

// Pretends to be rank `rank` of `size`: collectives only move this rank's data.
class FakeRankCommunicator final : public Communicator {
 public:
  FakeRankCommunicator(int rank, int size, uint64_t others_checksum = 0)
      : rank_(rank), size_(size), others_(others_checksum) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "fake"; }
  void all_reduce_sum(void*, int64_t, DType) override {}
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    for (int r = 0; r < size_; ++r) {
      auto* dst = static_cast<uint8_t*>(recv) + r * bytes;
      if (r == rank_ || others_ == 0) std::memcpy(dst, send, bytes);
      else std::memcpy(dst, &others_, std::min(bytes, sizeof(others_)));
    }
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::exit(code); }

 private:
  int rank_, size_;
  uint64_t others_;
};

class Tp : public TempDirTest {
 protected:
  std::filesystem::path make_model(const std::string& args) {
    auto dir = dir_ / "model";
    CommandResult r = run(lockstep("make-model --out " + dir.string() + " " + args), dir_ / "mk");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return dir;
  }
};

TEST_F(Tp, EachRankReadsOnlyItsShareOfTheShardedBytes) {
  auto model = make_model("--arch qwen2 --preset tiny --num-heads 8 --num-kv-heads 8 --head-dim 8");
  ModelConfig config = load_model_config(model);
  for (int size : {1, 2, 4}) {
    uint64_t total_read = 0, in_checkpoint = 0;
    for (int rank = 0; rank < size; ++rank) {
      TensorStore store(model);
      FakeRankCommunicator comm(rank, size);
      auto backend = make_cpu_backend();
      LoadStats stats;
      load_weights(store, config, ShardPlan::make(config, rank, size), comm, *backend, &stats);
      double share = static_cast<double>(stats.sharded_bytes_read) / stats.sharded_bytes_in_checkpoint;
      std::printf("TP=%d rank %d read %.4f of the sharded bytes (%llu of %llu), %llu replicated bytes\n", size, rank,
                  share, static_cast<unsigned long long>(stats.sharded_bytes_read),
                  static_cast<unsigned long long>(stats.sharded_bytes_in_checkpoint),
                  static_cast<unsigned long long>(stats.replicated_bytes_read));
      EXPECT_NEAR(share, 1.0 / size, 0.01 / size);
      EXPECT_EQ(stats.replicated_bytes_read > 0, rank == 0);  // replicated weights come from rank 0
      total_read += stats.sharded_bytes_read;
      in_checkpoint = stats.sharded_bytes_in_checkpoint;
    }
    EXPECT_EQ(total_read, in_checkpoint);  // together the ranks read every sharded byte exactly once
  }
}

// weight_bytes (the check against free memory before loading) is what
// load_weights then allocates, for each architecture's tensors, tied and
// untied tables, vocab padding, and float32 or 16-bit weights.
TEST_F(Tp, WeightBytesMatchWhatLoads) {
  const std::vector<std::string> shapes = {
      "--arch llama --preset tiny --vocab-size 301", "--arch llama --preset tiny --tie-word-embeddings",
      "--arch qwen2 --preset tiny --num-heads 8 --num-kv-heads 4 --head-dim 8", "--arch qwen3 --preset tiny",
      "--arch llama --preset tiny --attention-bias"};
  for (const std::string& shape : shapes) {
    std::filesystem::remove_all(dir_ / "model");
    auto model = make_model(shape);
    ModelConfig config = load_model_config(model);
    for (int size : {1, 2, 4}) {
      if (config.num_kv_heads % size != 0) continue;
      for (DType weight : {DType::kF32, DType::kBF16}) {
        TensorStore store(model);
        FakeRankCommunicator comm(size - 1, size);
        auto backend = make_cpu_backend(weight);
        const ShardPlan plan = ShardPlan::make(config, size - 1, size);
        const ModelWeights w = load_weights(store, config, plan, comm, *backend, nullptr);
        EXPECT_EQ(weight_bytes(config, plan, backend->weight_dtype(), backend->act_dtype()), w.bytes())
            << shape << " TP=" << size << " " << dtype_name(weight);
      }
    }
  }
}

// The KV budget every rank uses is the least any rank offers.
TEST_F(Tp, MinOverRanksTakesTheSmallestValue) {
  FakeRankCommunicator comm(0, 2, /*others=*/5000);
  EXPECT_EQ(min_over_ranks(comm, 7000), 5000);
  EXPECT_EQ(min_over_ranks(comm, 3000), 3000);
  EXPECT_EQ(min_over_ranks(*make_single_rank_communicator(), int64_t{1} << 40), int64_t{1} << 40);
}

TEST_F(Tp, ReplicatedChecksumMismatchIsAClearError) {
  auto model = make_model("--arch llama --preset tiny");
  ModelConfig config = load_model_config(model);
  TensorStore store(model);
  FakeRankCommunicator comm(0, 2, /*others_checksum=*/0x1234);
  auto backend = make_cpu_backend();
  LoadStats stats;
  load_weights(store, config, ShardPlan::make(config, 0, 2), comm, *backend, &stats);
  EXPECT_NO_THROW(verify_same_on_all_ranks(*make_single_rank_communicator(), stats.replicated_checksum, "x"));
  expect_error([&] { verify_same_on_all_ranks(comm, stats.replicated_checksum, "replicated weights checksum"); },
               ErrorKind::kRankFailure, {"replicated weights checksum", "rank(s) 1"});
}

struct LogitsRun {
  std::string ids;
  NpyArray generate_logits;
  NpyArray score_logits;
};

LogitsRun run_tp(const std::filesystem::path& model, int ranks, const std::filesystem::path& scratch,
                 const std::string& prompt, int new_tokens) {
  std::string launcher = ranks == 1 ? "" : mpirun(ranks);
  auto g = scratch / ("g" + std::to_string(ranks) + ".npy"), s = scratch / ("s" + std::to_string(ranks) + ".npy");
  CommandResult gen = run(launcher + lockstep("generate --backend cpu --model " + model.string() + " --prompt-ids " + prompt +
                                              " --ignore-eos --max-new-tokens " + std::to_string(new_tokens) +
                                              " --dump-logits " + g.string()),
                          scratch / "gen", 300);
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  CommandResult sc = run(launcher + lockstep("score --backend cpu --model " + model.string() + " --prompt-ids " + prompt +
                                             " --dump-logits " + s.string()),
                         scratch / "score", 300);
  EXPECT_EQ(sc.exit_code, 0) << sc.err;
  if (gen.exit_code != 0 || sc.exit_code != 0) return {};
  return {gen.out, read_npy(g), read_npy(s)};
}

double max_abs_diff(const NpyArray& a, const NpyArray& b) {
  EXPECT_EQ(a.shape, b.shape);
  double m = 0;
  for (size_t i = 0; i < std::min(a.values.size(), b.values.size()); ++i) m = std::max(m, std::abs(a.values[i] - b.values[i]));
  return m;
}

double stddev(const NpyArray& a) {
  double s = 0, sq = 0;
  for (double v : a.values) s += v, sq += v * v;
  double n = static_cast<double>(a.values.size());
  return std::sqrt(sq / n - (s / n) * (s / n));
}

// TP=2 and TP=4 (with KV heads replicated at TP=4 and the vocabulary padded
// at both) give the TP=1 greedy ids and logits within 1e-3 of their std:
// only the order of float32 sums differs.
TEST_F(Tp, TpTwoAndFourMatchTpOne) {
  auto model = make_model("--arch qwen3 --preset tiny --vocab-size 509 --tie-word-embeddings");
  LogitsRun one = run_tp(model, 1, dir_, "3,1,4,1,5,9,2,6", 8);
  for (int ranks : {2, 4}) {
    LogitsRun n = run_tp(model, ranks, dir_, "3,1,4,1,5,9,2,6", 8);
    EXPECT_EQ(n.ids, one.ids) << "TP=" << ranks;
    double gen_err = max_abs_diff(n.generate_logits, one.generate_logits);
    double score_err = max_abs_diff(n.score_logits, one.score_logits);
    double tol = 1e-3 * stddev(one.score_logits);
    std::printf("TP=%d vs TP=1: max |diff| generate %.3g, score %.3g (tolerance %.3g)\n", ranks, gen_err, score_err, tol);
    EXPECT_LE(gen_err, tol);
    EXPECT_LE(score_err, tol);
  }
}

// Sampling (temperature, top-k, top-p) picks the same ids at TP=1 and TP=2,
// on the backend (logits not kept: the sample op on the all-gathered shards)
// and on the host (--dump-logits: the CPU twin on the gathered logits).
TEST_F(Tp, SampledIdsMatchAcrossTpSizesAndKeptLogits) {
  auto model = make_model("--arch qwen3 --preset tiny --vocab-size 509");
  std::string first;
  for (int ranks : {1, 2})
    for (bool dump : {false, true}) {
      const std::string command =
          (ranks == 1 ? "" : mpirun(ranks)) +
          lockstep("generate --backend cpu --model " + model.string() +
                   " --prompt-ids 3,1,4,1,5 --ignore-eos --max-new-tokens 12 --temperature 1.1 --top-k 100"
                   " --top-p 0.95 --seed 42" +
                   (dump ? " --dump-logits " + (dir_ / "l.npy").string() : ""));
      CommandResult r = run(command, dir_ / "gen", 300);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      if (first.empty()) first = r.out;
      EXPECT_EQ(r.out, first) << "TP=" << ranks << " dump-logits " << dump;
    }
}

// A NaN logit in the second rank's share of the vocabulary (lm_head row 400
// of 512) leaves the row with no token at TP=2 as at TP=1, greedy (the
// ranks' argmax candidates merged) and sampled (the gathered shards).
TEST_F(Tp, ANanInOneRanksShareIsRefusedAsAtTpOne) {
  auto model = make_model("--arch llama --preset tiny");
  set_bf16_element(model / "model.safetensors", "lm_head.weight", 400 * 64, 0x7fc0);
  for (int ranks : {1, 2})
    for (const std::string sampling : {"", " --temperature 1 --seed 5"}) {
      CommandResult r = run((ranks == 1 ? "" : mpirun(ranks)) +
                                lockstep("generate --backend cpu --model " + model.string() +
                                         " --prompt-ids 1,2 --max-new-tokens 2" + sampling),
                            dir_ / "gen", 120);
      EXPECT_NE(r.exit_code, 0) << "TP=" << ranks << sampling << ": " << r.err;
      EXPECT_NE(r.err.find("new token 0 hold a NaN or +inf"), std::string::npos) << "TP=" << ranks << sampling << ": "
                                                                                  << r.err;
    }
}

TEST_F(Tp, IndivisibleTpSizeIsRefusedOnEveryRank) {
  auto model = make_model("--arch llama --preset tiny");
  CommandResult r = run(mpirun(3) + lockstep("generate --backend cpu --model " + model.string() + " --prompt-ids 1"), dir_ / "r", 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tensor-parallel size 3 does not divide num_attention_heads 4"), std::string::npos) << r.err;
}

TEST_F(Tp, KilledRankTakesTheJobDownWithinTenSeconds) {
  auto model = make_model("--arch llama --preset small");
  int code = 0;
  double seconds = seconds_to_end_after_signal(dir_, model, SIGKILL, "--backend cpu", 2000, &code);
  ASSERT_GE(seconds, 0) << "job still running 20 s after rank 1 was killed";
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(code, 0);
}

// A stopped rank never fails by itself: the others' collective deadline
// (--collective-timeout 3) ends the job.
TEST_F(Tp, StoppedRankIsCaughtByTheCollectiveDeadline) {
  auto model = make_model("--arch llama --preset small");
  int code = 0;
  double seconds = seconds_to_end_after_signal(dir_, model, SIGSTOP, "--backend cpu", 2000, &code);
  ASSERT_GE(seconds, 0) << "job still running 20 s after rank 1 was stopped";
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(code, 0);
  EXPECT_NE(read_file(dir_ / "job.log").find("did not complete within the collective timeout"), std::string::npos);
}

}  // namespace
}  // namespace lockstep
