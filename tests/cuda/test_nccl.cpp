// GPU tensor parallelism that one GPU can check (skipped without a GPU):
// TP=1 through the NCCL communicator against the single-rank one (bit for
// bit), and TP=2 with both ranks on the one GPU through the MPI transport's
// host-staged device path against TP=1 (NCCL itself refuses two ranks on one
// device).
#include <gtest/gtest.h>

#include <cmath>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "../cli_support.h"
#include "cuda_test_support.h"
#include "engine/io/npy.h"
#include "../test_support.h"

namespace lockstep {
namespace {

using namespace testing_cli;

class GpuTp : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    const auto dir = std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "tests/data/golden/qwen3_qknorm_bf16";
    model_ = (dir / "model").string();
    auto meta = nlohmann::json::parse(read_file(dir / "case.json"));
    prompt_ = fmt::format("{}", fmt::join(meta["prompt"].get<std::vector<int>>(), ","));
  }
  // Runs generate and returns (stdout ids, logits).
  std::pair<std::string, NpyArray> generate(const std::string& launcher, const std::string& args,
                                            const std::string& tag) {
    auto npy = dir_ / (tag + ".npy");
    CommandResult r = run(launcher + lockstep("generate --backend cuda --model " + model_ + " --prompt-ids " + prompt_ +
                                              " --max-new-tokens 8 --ignore-eos --dump-logits " + npy.string() + " " +
                                              args),
                          dir_ / tag, 300);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return {};
    return {r.out, read_npy(npy)};
  }
  std::string model_, prompt_;
};

TEST_F(GpuTp, NcclAtTpOneIsBitIdenticalToTheSingleRankCommunicator) {
  auto single = generate("", "--comm single", "single");
  auto nccl = generate("", "--comm nccl", "nccl");
  EXPECT_EQ(single.first, nccl.first);
  EXPECT_EQ(single.second.values, nccl.second.values);  // exact: TP=1 collectives must not touch the data
}

// Tolerance: bf16 keeps 8 significant bits; TP=2 changes only the order of
// the two partial sums of each row-parallel product, so its logits differ
// from TP=1's by bf16 rounding carried through the layers. On the `small`
// model the GPU's bf16 logits were within 0.05 of the logit std of float32
// ones (benchmarks/RESULTS.md); two bf16 runs differ by at most about twice
// that, hence 0.1 of the std. Greedy ids are compared in float32, where
// rounding cannot flip a near-tie.
TEST_F(GpuTp, TwoRanksOnOneGpuThroughHostStagingMatchTpOne) {
  auto one = generate("", "", "tp1");
  auto two = generate(mpirun(2), "--comm mpi", "tp2");
  ASSERT_EQ(one.second.shape, two.second.shape);
  double sum = 0, sq = 0, worst = 0;
  for (size_t i = 0; i < one.second.values.size(); ++i) {
    sum += one.second.values[i];
    sq += one.second.values[i] * one.second.values[i];
    worst = std::max(worst, std::abs(one.second.values[i] - two.second.values[i]));
  }
  const double n = static_cast<double>(one.second.values.size());
  const double std = std::sqrt(sq / n - (sum / n) * (sum / n));
  std::printf("TP=2 (host-staged MPI) vs TP=1, bf16: max |diff| %.4g = %.3g of the logit std\n", worst, worst / std);
  EXPECT_LE(worst, 0.1 * std);
  auto one32 = generate("", "--dtype float32", "tp1_f32");
  auto two32 = generate(mpirun(2), "--comm mpi --dtype float32", "tp2_f32");
  EXPECT_EQ(one32.first, two32.first);
}

}  // namespace
}  // namespace lockstep
