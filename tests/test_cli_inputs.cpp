// Bad inputs to the lockstep executable beyond those test_cli.cpp covers:
// command-line mistakes, folders given where files go, bench's flags,
// --prompts-file settings, configs that do not describe their checkpoint,
// weights that give non-finite logits, and make-model's output (a chat turn
// that does not fit: ChatCli.ChatKeepsTheConversationAcrossTurns). Each ends in
// one error line naming the problem and a non-zero exit, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "cli_support.h"

namespace lockstep {
namespace {

using namespace testing_cli;

class CliInputs : public Cli {
 protected:
  CommandResult lockstep_run(const std::string& args) { return run(lockstep(args), dir_ / "run"); }
  // One --prompts-file line, run through generate.
  CommandResult prompts_line(const std::filesystem::path& model, const std::string& line) {
    const auto file = dir_ / "prompts.jsonl";
    std::ofstream(file) << line << "\n";
    return generate(model, "--prompts-file " + file.string());
  }
  // Every byte of model.safetensors' data section set to `pattern` (two bytes, one bf16 value).
  void fill_weights(const std::filesystem::path& model, uint8_t lo, uint8_t hi) {
    const auto path = model / "model.safetensors";
    std::string bytes = read_file(path);
    uint64_t header = 0;
    std::memcpy(&header, bytes.data(), 8);
    for (size_t i = 8 + header; i + 1 < bytes.size(); i += 2) bytes[i] = static_cast<char>(lo), bytes[i + 1] = static_cast<char>(hi);
    std::ofstream(path, std::ios::binary) << bytes;
  }
};

TEST_F(CliInputs, CommandLineMistakesAreOneErrorLine) {
  expect_clean_failure(lockstep_run("frobnicate"), {"unknown command 'frobnicate'", "generate", "bench"});
  expect_clean_failure(lockstep_run(""), {"no command given", "generate"});
  auto model = make_model("m");
  CommandResult flag = generate(model, "--prompt-ids 1 --frob");
  expect_clean_failure(flag, {"--frob"});
  EXPECT_EQ(flag.err.find("Run with --help"), std::string::npos) << flag.err;
  expect_clean_failure(generate(model, "--prompt-ids 1 --threads 99999999999"), {"--threads"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --threads 100000"), {"--threads 100000", "1024"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --seed -1"), {"--seed", ">= 0"});
  expect_clean_failure(generate(model, "--prompt-ids 1,2,"), {"--prompt-ids", "''"});
}

// vLLM refuses max_tokens < 1 as well: a request for no tokens is a mistake.
TEST_F(CliInputs, NoNewTokensIsRefused) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 0"), {"--max-new-tokens", ">= 1"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1, 2], "max_new_tokens": 0})"),
                       {"line 1", "max_new_tokens", "[1,"});
}

TEST_F(CliInputs, FoldersGivenAsFilesAreNamed) {
  auto model = make_model("m");
  const std::string folder = dir_.string();
  expect_clean_failure(generate(model, "--prompt-file " + folder), {"--prompt-file", "is a folder"});
  expect_clean_failure(generate(model, "--prompts-file " + folder), {"--prompts-file", "is a folder"});
  expect_clean_failure(lockstep_run("tokenize --tokenizer " + model.string() + " --text-file " + folder),
                       {"--text-file", "is a folder"});
  expect_clean_failure(generate(model, "--chat --prompt hi --chat-template " + folder), {"chat template", "is a folder"});
  expect_clean_failure(generate(model, "--messages " + folder), {"messages file", "is a folder"});
  expect_clean_failure(generate(model, "--prompt-file " + (dir_ / "absent.txt").string()),
                       {"--prompt-file", "absent.txt", "does not exist"});
}

TEST_F(CliInputs, BenchFlagsAreCheckedBeforeLoading) {
  auto model = make_model("m");
  const std::string bench = "bench --backend cpu --model " + model.string();
  const std::string sizes = " --prefill 8 --steps 6 --ctx 8";
  expect_clean_failure(lockstep_run(bench + sizes + " --batch 1.5"), {"--batch", "'1.5'"});
  expect_clean_failure(lockstep_run(bench + sizes + " --batch 1,"), {"--batch", "''"});
  expect_clean_failure(lockstep_run(bench + sizes + " --batch 0"), {"--batch", ">= 1"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx 0"), {"--ctx", ">= 1"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx -4"), {"--ctx", "-4"});
  expect_clean_failure(lockstep_run(bench + " --prefill -1 --steps 6 --ctx 8"), {"--prefill", "-1"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps -6 --ctx 8"), {"--steps > 4", "-6"});
  expect_clean_failure(lockstep_run(bench + sizes + " --arch qwen3"), {"--arch", "--preset"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx 600"),
                       {"--ctx + --steps", "606", "max_position_embeddings 512"});
}

TEST_F(CliInputs, PromptsFileSettingsAreStrict) {
  auto model = make_model("m");
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "max_new_tokens": 1.9})"),
                       {"line 1", "\"max_new_tokens\" must be an integer", "1.9"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "max_new_tokens": 1e30})"),
                       {"\"max_new_tokens\" must be in"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "temperature": 1, "top_k": 2.7})"),
                       {"\"top_k\" must be an integer", "2.7"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "seed": -1})"), {"\"seed\"", ">= 0", "-1"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "seed": 1.5})"), {"\"seed\"", "1.5"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "temprature": 0.5})"),
                       {"line 1", "unknown key \"temprature\"", "temperature"});
  CommandResult ok = prompts_line(model, R"({"prompt_ids": [1], "max_new_tokens": 2.0, "seed": 18446744073709551615})");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(CliInputs, ConfigsThatDoNotDescribeTheCheckpoint) {
  auto model = make_model("m");
  rewrite_config(model, [](nlohmann::json& j) { j["num_hidden_layers"] = 1; });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"layer 1", "num_hidden_layers is 1"});
  rewrite_config(model, [](nlohmann::json& j) {
    j["num_hidden_layers"] = 2;
    j["model_type"] = "qwen3";
  });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"model_type \"qwen3\"", "LlamaForCausalLM"});
  rewrite_config(model, [](nlohmann::json& j) {
    j["model_type"] = "llama";
    j["rms_norm_eps"] = 1e300;
  });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"rms_norm_eps", "(0, 1)"});
  rewrite_config(model, [](nlohmann::json& j) {
    j["rms_norm_eps"] = 1e-5;
    j["head_dim"] = int64_t{1} << 62;
  });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"'head_dim'", "maximum"});
  // transformers ties the head and leaves lm_head.weight unread; so does lockstep, saying so.
  rewrite_config(model, [](nlohmann::json& j) {
    j.erase("head_dim");
    j["tie_word_embeddings"] = true;
  });
  CommandResult tied = generate(model, "--prompt-ids 1 --max-new-tokens 2");
  ASSERT_EQ(tied.exit_code, 0) << tied.err;
  EXPECT_NE(tied.err.find("lm_head.weight in the checkpoint is not used"), std::string::npos) << tied.err;
}

TEST_F(CliInputs, GenerationConfigErrorsNameThatFile) {
  auto model = make_model("m");
  std::ofstream(model / "generation_config.json") << R"({"eos_token_id": 99999})";
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"generation_config.json:", "99999"});
  std::ofstream(model / "generation_config.json") << R"({"eos_token_id": "x"})";
  CommandResult r = generate(model, "--prompt-ids 1");
  expect_clean_failure(r, {"generation_config.json:", "eos_token_id"});
  EXPECT_EQ(r.err.find(": config.json:"), std::string::npos) << r.err;
}

// NaN weights (bf16 0x7fc0) make every logit NaN: no token to choose, greedy
// or sampled, and no logits to write.
TEST_F(CliInputs, NonFiniteLogitsAreRefused) {
  auto model = make_model("m");
  fill_weights(model, 0xc0, 0x7f);
  expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 3"), {"NaN or -inf", "non-finite"});
  expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 3 --temperature 1 --seed 3"),
                       {"NaN or -inf"});
  expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 3 --dump-logits " + (dir_ / "l.npy").string()),
                       {"NaN or -inf"});
  expect_clean_failure(lockstep_run("score --backend cpu --model " + model.string() + " --prompt-ids 1,2 --dump-logits " +
                                    (dir_ / "s.npy").string()),
                       {"position 0", "non-finite"});
}

TEST_F(CliInputs, PathsAndFlagsThatDoNotFit) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --devices 1"), {"--devices", "cpu"});
  expect_clean_failure(generate(model / "config.json", "--prompt-ids 1"), {"--model", "is a file"});
  auto sharded = make_model("s", "--max-shard-bytes 20000");
  ASSERT_TRUE(std::filesystem::exists(sharded / "model.safetensors.index.json"));
  std::ofstream(sharded / "model.safetensors.index.json") << "{\"weight_map\": ";
  expect_clean_failure(generate(sharded, "--prompt-ids 1"), {"model.safetensors.index.json", "index is not valid JSON"});
}

TEST_F(CliInputs, MakeModelChecksItsOutputFirst) {
  const auto file = dir_ / "a_file";
  std::ofstream(file) << "x";
  expect_clean_failure(lockstep_run("make-model --out " + file.string()), {"--out", "is a file"});
  const auto huge = dir_ / "huge";
  expect_clean_failure(lockstep_run("make-model --hidden-size 1000000 --num-layers 100 --out " + huge.string()),
                       {"--out", "GB free"});
  EXPECT_FALSE(std::filesystem::exists(huge / "model.safetensors"));
}

}  // namespace
}  // namespace lockstep
