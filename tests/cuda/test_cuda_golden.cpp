// The golden models (transformers, float64) through `score` and `generate` on
// the GPU backend, in float32 and in the checkpoint's 16-bit dtype (float32
// checkpoints run in bf16 unless --dtype float32). Skipped without a GPU.
//
// Tolerances, as fractions of the golden logits' standard deviation:
// - float32: 1e-3, as on the CPU (float32 arithmetic in another order).
// - bf16: 0.1. bf16 keeps 8 significant bits (2^-9 relative per rounding);
//   activations are rounded to bf16 at every sub-phase boundary and the
//   weights of float32 checkpoints once at load, and the LM head sums
//   hidden-size products of rounded values. On the `small` model the GPU's
//   bf16 logits were 0.049 of the std from float32 (benchmarks/RESULTS.md);
//   0.1 leaves room for other shapes while a real mistake (a wrong norm, bias
//   or rotation) moves logits by a large fraction of the std.
// - f16: 0.03. Three more significant bits than bf16 (8x finer), with the
//   same accumulation: 0.1 / 8 rounded up generously.
// Greedy ids must match the golden ones, except that in 16-bit a step whose
// golden top-2 margin is below twice the tolerance may flip (a near-tie that
// rounding decides); logits are compared up to and including that step.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "../cli_support.h"
#include "../golden_support.h"
#include "../test_support.h"
#include "cuda_test_support.h"

namespace lockstep {
namespace {

using namespace testing_cli;
using namespace golden;

struct CudaGoldenParam {
  std::string name;
  bool float32;  // --dtype float32, else the checkpoint's 16-bit dtype (bf16 for float32 checkpoints)
};

std::vector<CudaGoldenParam> cuda_golden_params() {
  std::vector<CudaGoldenParam> p;
  for (const auto& n : golden_cases())
    for (bool f32 : {true, false}) p.push_back({n, f32});
  return p;
}

class CudaGolden : public TempDirTest, public ::testing::WithParamInterface<CudaGoldenParam> {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

class CudaCli : public TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
  // The tiny preset and write_shared_prefix_prompts' 7 requests.
  void make_model_and_prompts() {
    ASSERT_EQ(run(lockstep("make-model --preset tiny --out " + model().string()), dir_ / "make").exit_code, 0);
    write_shared_prefix_prompts(prompts());
  }
  // `generate` over those requests with `flags`: (stdout, stderr).
  std::pair<std::string, std::string> generate_prompts(const std::string& flags) {
    const CommandResult r = run(lockstep("generate --model " + model().string() + " --prompts-file " +
                                         prompts().string() + " --ignore-eos " + flags),
                                dir_ / "gen");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return {r.out, r.err};
  }
  fs::path model() const { return dir_ / "m"; }
  fs::path prompts() const { return dir_ / "p.jsonl"; }
};

TEST_P(CudaGolden, ScoreAndGenerateMatchTransformers) {
  const CudaGoldenParam gp = GetParam();
  const fs::path dir = golden_root() / gp.name;
  nlohmann::json meta = nlohmann::json::parse(read_file(dir / "case.json"));
  const std::string prompt = fmt::format("{}", fmt::join(meta["prompt"].get<std::vector<int>>(), ","));
  const std::string common = "--backend cuda --model " + (dir / "model").string() + " --prompt-ids " + prompt +
                             (gp.float32 ? " --dtype float32" : "");
  const double fraction = gpu_tolerance_fraction(gp.float32, meta["dtype"].get<std::string>());

  CommandResult s = run(lockstep("score " + common + " --dump-logits " + (dir_ / "score.npy").string()),
                        dir_ / "score", 300);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  NpyArray golden_score = read_npy(dir / "score.npy"), ours_score = read_npy(dir_ / "score.npy");
  const double score_tol = fraction * stddev(golden_score);
  const double score_err = max_abs_diff(ours_score, golden_score);

  const auto want = meta["greedy"].get<std::vector<int>>();
  CommandResult g = run(lockstep("generate " + common + " --ignore-eos --max-new-tokens " +
                                 std::to_string(want.size()) + " --dump-logits " + (dir_ / "gen.npy").string()),
                        dir_ / "gen", 300);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  std::istringstream out(g.out);
  std::vector<int> ids;
  for (int id; out >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), want.size()) << g.out;

  NpyArray golden_gen = read_npy(dir / "generate.npy"), ours_gen = read_npy(dir_ / "gen.npy");
  ASSERT_EQ(ours_gen.shape, golden_gen.shape);
  const double gen_tol = fraction * stddev(golden_gen);
  double gen_err = 0;
  size_t compared = 0;
  for (; compared < want.size(); ++compared) {
    const auto a = row(ours_gen, compared), b = row(golden_gen, compared);
    for (size_t c = 0; c < a.size(); ++c) gen_err = std::max(gen_err, std::abs(a[c] - b[c]));
    if (ids[compared] == want[compared]) continue;
    const double margin = top2_margin(b);
    EXPECT_FALSE(gp.float32) << "float32 greedy id differs at step " << compared;
    EXPECT_LT(margin, 2 * gen_tol) << "greedy id differs at step " << compared << " where the golden top-2 margin "
                                   << margin << " is not a near-tie";
    ++compared;
    break;
  }
  const auto same = static_cast<size_t>(std::mismatch(ids.begin(), ids.end(), want.begin()).first - ids.begin());
  std::printf("%s %s: score max err %.3g (%.3g of std, tol %.3g); generate max err %.3g over %zu of %zu steps "
              "(tol %.3g); %zu of %zu greedy ids identical\n",
              gp.name.c_str(), gp.float32 ? "float32" : "16-bit", score_err, score_err / stddev(golden_score),
              fraction, gen_err, compared, want.size(), gen_tol, same, want.size());
  EXPECT_LE(score_err, score_tol);
  EXPECT_LE(gen_err, gen_tol);
}

// A head size the CUDA backend has no attention kernel for is refused in one
// error line before the weights load; the CPU backend runs the same model.
TEST_F(CudaCli, UnsupportedHeadDimIsRefusedBeforeLoading) {
  const fs::path model = dir_ / "hd100";
  CommandResult made = run(lockstep("make-model --preset tiny --head-dim 100 --out " + model.string()), dir_ / "make");
  ASSERT_EQ(made.exit_code, 0) << made.err;
  const std::string args = " --model " + model.string() + " --prompt-ids 1,2,3 --max-new-tokens 2";
  CommandResult cuda = run(lockstep("generate --backend cuda" + args), dir_ / "cuda");
  EXPECT_NE(cuda.exit_code, 0) << cuda.err;
  EXPECT_LT(cuda.exit_code, 128) << "killed by a signal: " << cuda.err;
  EXPECT_NE(cuda.err.find("[error] model error: attention: head_dim 100 is not supported by the CUDA backend"),
            std::string::npos)
      << cuda.err;
  EXPECT_EQ(cuda.err.find("loaded in"), std::string::npos) << "refused only after loading: " << cuda.err;
  CommandResult cpu = run(lockstep("generate --backend cpu" + args), dir_ / "cpu");
  EXPECT_EQ(cpu.exit_code, 0) << cpu.err;
}

// An Inf in the final norm's weight (CliInputs.AnInfiniteNormWeightIsRefused
// on the CPU): the GPU's greedy and sampled steps, graphed and eager, find no
// token in the rows of +infs and -infs, and score refuses the logits.
TEST_F(CudaCli, NonFiniteLogitsAreRefused) {
  ASSERT_EQ(run(lockstep("make-model --preset tiny --out " + model().string()), dir_ / "make").exit_code, 0);
  set_bf16_element(model() / "model.safetensors", "model.norm.weight", 3, 0x7f80);
  std::ofstream(prompts()) << "{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [3, 4, 5]}\n";
  const std::string common = " --backend cuda --model " + model().string();
  for (const std::string& flags : std::vector<std::string>{" --prompt-ids 1,2", " --prompt-ids 1,2 --eager",
                                  " --prompt-ids 1,2 --temperature 1 --seed 3",
                                  " --max-batch 2 --prompts-file " + prompts().string()}) {
    CommandResult r = run(lockstep("generate" + common + " --max-new-tokens 3" + flags), dir_ / "gen");
    EXPECT_NE(r.exit_code, 0) << flags << ": " << r.err;
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
    EXPECT_NE(r.err.find("new token 0 hold a NaN or +inf"), std::string::npos) << flags << ": " << r.err;
  }
  CommandResult s =
      run(lockstep("score" + common + " --prompt-ids 1,2 --dump-logits " + (dir_ / "s.npy").string()), dir_ / "score");
  EXPECT_NE(s.exit_code, 0) << s.err;
  EXPECT_NE(s.err.find("non-finite"), std::string::npos) << s.err;
}

// Weights larger than the GPU are refused before they are generated or read:
// llama3-70b in float32 (263 GiB) exceeds an H100's and an H200's memory.
TEST_F(CudaCli, WeightsLargerThanTheGpuAreRefusedBeforeLoading) {
  const std::string args = "bench --backend cuda --preset llama3-70b --dtype float32 --batch 1 --steps 8 --ctx 8 "
                           "--prefill 8";
  CommandResult r = run(lockstep(args), dir_ / "oom", 60);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_NE(r.err.find("[error] out of memory: this rank's share of the weights needs 262.8"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("GiB free (more GPUs"), std::string::npos) << r.err;
}

TEST_F(CudaCli, DevicesPastTheHostsGpusAreRefused) {
  make_model_and_prompts();
  const std::string args = "generate --backend cuda --model " + model().string() + " --prompt-ids 1,2 --devices 999";
  CommandResult r = run(lockstep(args), dir_ / "devices");
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
  EXPECT_NE(r.err.find("[error] invalid argument: --devices: GPU 999 does not exist"), std::string::npos) << r.err;
}

// --prompts-file with shared prefixes on the GPU: the prefixes copied between
// KV-cache slots (a device-to-device copy) give the ids of whole prefills and
// of the CPU backend. In float32, where a flip needs a top-2 margin as small
// as float32's reordering error (~1e-6 of the logits; the random model's
// margins are ~1e-2), so the ids must be equal.
TEST_F(CudaCli, PromptsFileSharedPrefixesMatchCpu) {
  make_model_and_prompts();
  const auto [reused, log] = generate_prompts("--max-batch 3 --backend cuda --dtype float32");
  EXPECT_NE(log.find("7 requests: 161 prompt tokens, 114 of them found in the KV cache"), std::string::npos) << log;
  EXPECT_EQ(reused, generate_prompts("--max-batch 3 --backend cuda --dtype float32 --no-prefix-reuse").first);
  EXPECT_EQ(reused, generate_prompts("--max-batch 3 --backend cpu").first);
}

// Decode steps of 3-7 sequences in bf16, whose products are cuBLASLt's:
// replayed graphs give the ids of the same steps run eagerly (the same
// padded batch, so the same kernels and sums: equal, not close). A kernel in
// a graph that reads its input before the kernel writing it ends would not
// (benchmarks/NOTES.md, thirtieth session).
TEST_F(CudaCli, BatchedBf16GraphsGiveTheEagerIds) {
  make_model_and_prompts();
  const std::string flags = "--max-batch 8 --backend cuda --dtype bf16";
  const auto [graphed, log] = generate_prompts(flags);
  EXPECT_NE(log.find(", graphs"), std::string::npos) << log;
  EXPECT_EQ(graphed, generate_prompts(flags + " --eager").first);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGolden, ::testing::ValuesIn(cuda_golden_params()),
                         [](const ::testing::TestParamInfo<CudaGoldenParam>& info) {
                           return info.param.name + (info.param.float32 ? "_float32" : "_16bit");
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaGolden);

}  // namespace
}  // namespace lockstep
