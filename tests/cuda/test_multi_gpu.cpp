// Tensor parallelism across GPUs through NCCL: TP=N against TP=1 on the
// golden models and a `small` model (greedy ids and logits), and a killed or
// stopped rank ending the job. A test that needs N GPUs reports itself
// skipped on a machine with fewer; so does a TP size the model's shape does
// not admit (its heads or intermediate size not divisible).
//
// Tolerances: TP=N changes only the order in which the partial sums of each
// row-parallel product are added (an all-reduce of N parts) and which rank
// computes which heads; the arithmetic is otherwise the same. The logits of
// TP=N are held to the same fraction of the logit std as the GPU against
// transformers (golden_support.h: float32 1e-3, f16 0.03, bf16 0.1), here
// of TP=1's logits. Greedy ids must be identical in float32; in 16 bits a
// step may flip only where TP=1's top-2 margin is below twice the
// tolerance (a near-tie rounding decides), and logits are compared up to
// and including that step.
#include <gtest/gtest.h>
#include <signal.h>

#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "../cli_support.h"
#include "../fault_support.h"
#include "../golden_support.h"
#include "../test_support.h"
#include "cuda_test_support.h"
#include "engine/config.h"
#include "tp/sharding.h"

namespace lockstep {
namespace {

using namespace testing_cli;
using namespace golden;

struct TpRun {
  std::vector<int> ids;
  NpyArray generate_logits, score_logits;
};

// `generate` (greedy, `new_tokens`) and `score` of `prompt` at `ranks` GPUs
// (NCCL; one rank: no transport), logits kept.
TpRun run_at(int ranks, const fs::path& model, const std::string& prompt, int new_tokens, const std::string& args,
             const fs::path& scratch) {
  const std::string launcher = ranks == 1 ? "" : mpirun(ranks);
  const std::string common = "--backend cuda --model " + model.string() + " --prompt-ids " + prompt + " " + args +
                             (ranks == 1 ? "" : " --comm nccl");
  const std::string tag = "tp" + std::to_string(ranks);
  const fs::path gen = scratch / (tag + "_gen.npy"), score = scratch / (tag + "_score.npy");
  CommandResult g = run(launcher + lockstep("generate " + common + " --ignore-eos --max-new-tokens " +
                                            std::to_string(new_tokens) + " --dump-logits " + gen.string()),
                        scratch / (tag + "_gen"), 120);
  EXPECT_EQ(g.exit_code, 0) << g.err;
  CommandResult s = run(launcher + lockstep("score " + common + " --dump-logits " + score.string()),
                        scratch / (tag + "_score"), 120);
  EXPECT_EQ(s.exit_code, 0) << s.err;
  if (g.exit_code != 0 || s.exit_code != 0) return {};
  TpRun r{.generate_logits = read_npy(gen), .score_logits = read_npy(score)};
  std::istringstream out(g.out);
  for (int id; out >> id;) r.ids.push_back(id);
  return r;
}

// Runs TP=1 and TP=`ranks` and holds them to the rules above.
void expect_tp_matches_tp_one(int ranks, const fs::path& model, const std::string& prompt, int new_tokens,
                              const std::string& args, bool float32, double fraction, const fs::path& scratch) {
  const TpRun one = run_at(1, model, prompt, new_tokens, args, scratch);
  const TpRun n = run_at(ranks, model, prompt, new_tokens, args, scratch);
  ASSERT_EQ(one.ids.size(), static_cast<size_t>(new_tokens));
  ASSERT_EQ(n.ids.size(), one.ids.size());
  ASSERT_EQ(n.generate_logits.shape, one.generate_logits.shape);
  const double tol = fraction * stddev(one.score_logits);
  const double score_err = max_abs_diff(n.score_logits, one.score_logits);
  double gen_err = 0;
  size_t compared = 0;
  for (; compared < one.ids.size(); ++compared) {
    const auto a = row(n.generate_logits, compared), b = row(one.generate_logits, compared);
    for (size_t c = 0; c < a.size(); ++c) gen_err = std::max(gen_err, std::abs(a[c] - b[c]));
    if (n.ids[compared] == one.ids[compared]) continue;
    const double margin = top2_margin(b);
    EXPECT_FALSE(float32) << "float32 greedy id differs at step " << compared;
    EXPECT_LT(margin, 2 * tol) << "greedy id differs at step " << compared << " where TP=1's top-2 margin " << margin
                               << " is not a near-tie";
    ++compared;
    break;
  }
  const auto same = static_cast<size_t>(std::mismatch(n.ids.begin(), n.ids.end(), one.ids.begin()).first -
                                        n.ids.begin());
  std::printf("TP=%d vs TP=1 %s: score max |diff| %.3g (%.3g of std, tol %.3g); generate %.3g over %zu of %zu steps; "
              "%zu of %zu greedy ids identical\n",
              ranks, float32 ? "float32" : "16-bit", score_err, score_err / stddev(one.score_logits), fraction,
              gen_err, compared, one.ids.size(), same, one.ids.size());
  EXPECT_LE(score_err, tol);
  EXPECT_LE(gen_err, tol);
}

// Skips unless this machine has `ranks` GPUs and the model's shape admits
// TP=`ranks`.
void skip_unless_runnable(int ranks, const fs::path& model) {
  if (cuda_device_count() < ranks) GTEST_SKIP() << "needs " << ranks << " GPUs, " << cuda_device_count() << " visible";
  try {
    ShardPlan::make(load_model_config(model), 0, ranks);
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
}

struct MultiGpuGoldenParam {
  std::string name;
  bool float32;
  int ranks;
};

std::vector<MultiGpuGoldenParam> multi_gpu_golden_params() {
  std::vector<MultiGpuGoldenParam> p;
  for (int ranks : {2, 4, 8})
    for (const auto& n : golden_cases())
      for (bool f32 : {true, false}) p.push_back({n, f32, ranks});
  return p;
}

class MultiGpuGolden : public TempDirTest, public ::testing::WithParamInterface<MultiGpuGoldenParam> {};

TEST_P(MultiGpuGolden, TpNMatchesTpOne) {
  const MultiGpuGoldenParam gp = GetParam();
  const fs::path dir = golden_root() / gp.name;
  skip_unless_runnable(gp.ranks, dir / "model");
  if (IsSkipped()) return;
  nlohmann::json meta = nlohmann::json::parse(read_file(dir / "case.json"));
  const std::string prompt = fmt::format("{}", fmt::join(meta["prompt"].get<std::vector<int>>(), ","));
  const int new_tokens = static_cast<int>(meta["greedy"].size());
  expect_tp_matches_tp_one(gp.ranks, dir / "model", prompt, new_tokens, gp.float32 ? "--dtype float32" : "",
                           gp.float32, gpu_tolerance_fraction(gp.float32, meta["dtype"].get<std::string>()), dir_);
}

INSTANTIATE_TEST_SUITE_P(Cases, MultiGpuGolden, ::testing::ValuesIn(multi_gpu_golden_params()),
                         [](const ::testing::TestParamInfo<MultiGpuGoldenParam>& info) {
                           return info.param.name + (info.param.float32 ? "_float32" : "_16bit") + "_tp" +
                                  std::to_string(info.param.ranks);
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(MultiGpuGolden);

class WithModel : public TempDirTest {
 protected:
  fs::path make_model(const std::string& args) {
    const fs::path dir = dir_ / "model";
    CommandResult r = run(lockstep("make-model --out " + dir.string() + " " + args), dir_ / "mk", 300);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return dir;
  }
};

class MultiGpu : public WithModel, public ::testing::WithParamInterface<int> {};

// The `small` model (random bf16 weights), 64 greedy tokens, in float32 and
// in bf16.
TEST_P(MultiGpu, SmallModelTpNMatchesTpOne) {
  const int ranks = GetParam();
  if (cuda_device_count() < ranks) GTEST_SKIP() << "needs " << ranks << " GPUs, " << cuda_device_count() << " visible";
  const fs::path model = make_model("--preset small");
  const std::string prompt = "1,20,300,4000,5,60,700,8000";
  expect_tp_matches_tp_one(ranks, model, prompt, 64, "--dtype float32", true, gpu_tolerance_fraction(true, ""), dir_);
  expect_tp_matches_tp_one(ranks, model, prompt, 64, "", false, gpu_tolerance_fraction(false, "torch.bfloat16"),
                           dir_);
}

INSTANTIATE_TEST_SUITE_P(Ranks, MultiGpu, ::testing::Values(2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) { return "tp" + std::to_string(info.param); });

// A rank killed or stopped while two GPUs decode through NCCL: the other
// rank's collective deadline (--collective-timeout 3) or mpirun ends the job
// within 10 s. The model's context is long enough (100k positions) that the
// job is still decoding when the signal comes.
class MultiGpuFaults : public WithModel {
 protected:
  void SetUp() override {
    WithModel::SetUp();
    if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << cuda_device_count() << " visible";
  }
  // Seconds from `signal` to rank 1 until the job ended (-1: still running after 20 s).
  double seconds_to_end_after(int signal, int* exit_code) {
    const fs::path model = make_model("--preset small --max-position-embeddings 100000");
    return seconds_to_end_after_signal(dir_, model, signal, "--backend cuda --comm nccl", 90000, exit_code);
  }
};

TEST_F(MultiGpuFaults, KilledRankEndsTheJob) {
  int code = 0;
  const double seconds = seconds_to_end_after(SIGKILL, &code);
  ASSERT_GE(seconds, 0) << "job still running 20 s after rank 1 was killed";
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(code, 0);
}

TEST_F(MultiGpuFaults, StoppedRankIsCaughtByTheCollectiveDeadline) {
  int code = 0;
  const double seconds = seconds_to_end_after(SIGSTOP, &code);
  ASSERT_GE(seconds, 0) << "job still running 20 s after rank 1 was stopped";
  EXPECT_LT(seconds, 10.0);
  EXPECT_NE(code, 0);
  EXPECT_NE(read_file(dir_ / "job.log").find("did not complete within the collective timeout"), std::string::npos)
      << read_file(dir_ / "job.log");
}

}  // namespace
}  // namespace lockstep
