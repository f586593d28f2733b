// Bad inputs to the lockstep executable beyond those test_cli.cpp covers:
// command-line mistakes, folders given where files go, bench's flags,
// --prompts-file settings, configs that do not describe their checkpoint,
// weights that give non-finite logits, and make-model's output (a chat turn
// that does not fit: ChatCli.ChatKeepsTheConversationAcrossTurns). Each ends in
// one error line naming the problem and a non-zero exit, never a crash.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
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
  // Weights whose first logits are not finite: generate refuses its first
  // token, greedy, sampled or keeping the logits, and score the logits.
  void expect_non_finite_logits_refused(const std::filesystem::path& model) {
    expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 3"),
                         {"request 0", "new token 0", "NaN or +inf", "non-finite"});
    expect_clean_failure(generate(model, "--prompt-ids 1,2 --max-new-tokens 3 --temperature 1 --seed 3"),
                         {"NaN or +inf"});
    expect_clean_failure(
        generate(model, "--prompt-ids 1,2 --max-new-tokens 3 --dump-logits " + (dir_ / "l.npy").string()),
        {"NaN or +inf"});
    expect_clean_failure(lockstep_run("score --backend cpu --model " + model.string() +
                                      " --prompt-ids 1,2 --dump-logits " + (dir_ / "s.npy").string()),
                         {"position 0", "non-finite"});
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
  expect_clean_failure(generate(model, "--prompt-ids 1 --seed -1"), {"--seed", "from 0"});
  CommandResult top_seed = generate(model, "--prompt-ids 1 --max-new-tokens 1 --seed 18446744073709551615");
  EXPECT_EQ(top_seed.exit_code, 0) << top_seed.err;
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
  expect_clean_failure(lockstep_run(bench + sizes + " --batch 0"), {"--batch", "from 1", "got 0"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx 0"), {"--ctx", ">= 1"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx -4"), {"--ctx", "-4"});
  expect_clean_failure(lockstep_run(bench + " --prefill -1 --steps 6 --ctx 8"), {"--prefill", "-1"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps -6 --ctx 8"), {"--steps > 4", "-6"});
  expect_clean_failure(lockstep_run(bench + sizes + " --arch qwen3"), {"--arch", "--preset"});
  expect_clean_failure(lockstep_run(bench + sizes + " --prefill-runs 0"), {"--prefill-runs", "from 1", "got 0"});
  expect_clean_failure(lockstep_run(bench + sizes + " --prefill-runs 1001"), {"--prefill-runs", "got 1001"});
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
  // A number setting of the wrong type is named, not left to a JSON library's message.
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "temperature": "hot"})"),
                       {"line 1", "\"temperature\" must be a number", "hot"});
  expect_clean_failure(prompts_line(model, R"({"prompt_ids": [1], "top_p": [0.5]})"), {"\"top_p\" must be a number"});
  // A line's "messages" are held to what --messages holds its file to: each
  // an object with a string "role" (else a template renders 7 as nothing).
  for (const char* messages :
       {R"([{"role": "user", "content": "hi"}, 7])", R"([{"role": "user", "content": "hi"}, {"role": 5}])"})
    expect_clean_failure(prompts_line(model, std::string(R"({"messages": )") + messages + "}"),
                         {"line 1", "message 1 is not an object with a string \"role\""});
  for (const char* messages : {"[]", "{}", "\"hi\""})
    expect_clean_failure(prompts_line(model, std::string(R"({"messages": )") + messages + "}"),
                         {"line 1", "\"messages\": expected a non-empty list of messages"});
  // Other keys are not read (a dataset's "id"), and named so that a misspelt setting shows.
  CommandResult typo = prompts_line(model, R"({"prompt_ids": [1], "temprature": 0.5, "id": "a"})");
  EXPECT_EQ(typo.exit_code, 0) << typo.err;
  EXPECT_NE(typo.err.find("line 1: key \"temprature\" is not used (known: prompt,"), std::string::npos) << typo.err;
  CommandResult ok = prompts_line(model, R"({"prompt_ids": [1], "max_new_tokens": 2.0, "seed": 18446744073709551615})");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
}

TEST_F(CliInputs, ConfigsThatDoNotDescribeTheCheckpoint) {
  auto model = make_model("m");
  // A config cut down to fewer layers runs the first ones, as transformers does, saying so.
  rewrite_config(model, [](nlohmann::json& j) { j["num_hidden_layers"] = 1; });
  CommandResult cut = generate(model, "--prompt-ids 1 --max-new-tokens 1");
  EXPECT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_NE(cut.err.find("layers 1-1, past config.json's num_hidden_layers 1"), std::string::npos) << cut.err;
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
  std::ofstream(model / "generation_config.json") << "[1, 2]";
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"generation_config.json:", "JSON object"});
  std::filesystem::remove(model / "generation_config.json");
  std::filesystem::create_symlink(dir_ / "absent.json", model / "generation_config.json");
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"generation_config.json:", "does not exist"});
}

// NaN weights (bf16 0x7fc0) make every logit NaN: no token to choose, greedy
// or sampled, and no logits to write.
TEST_F(CliInputs, NonFiniteLogitsAreRefused) {
  auto model = make_model("m");
  fill_weights(model, 0xc0, 0x7f);
  expect_non_finite_logits_refused(model);
}

// An Inf in the final norm's weight gives each logit row +infs and -infs (or
// NaNs): no token to choose, greedy (which took the first +inf) or sampled,
// and score refuses the logits. CudaCli.NonFiniteLogitsAreRefused: the GPU.
TEST_F(CliInputs, AnInfiniteNormWeightIsRefused) {
  auto model = make_model("m");
  set_bf16_element(model / "model.safetensors", "model.norm.weight", 3, 0x7f80);
  expect_non_finite_logits_refused(model);
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

// A model file that is a link looping on itself is one error line naming it
// (exit 2), not an "unexpected failure" (exit 3) from a std::filesystem call.
TEST_F(CliInputs, LinksThatLoopAreNamed) {
  for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
    auto model = make_model(std::string("m_") + name);
    std::filesystem::remove(model / name);
    std::filesystem::create_symlink(name, model / name);
    CommandResult r = generate(model, "--prompt hi --max-new-tokens 1");
    expect_clean_failure(r, {name, "Too many levels of symbolic links"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(r.err.find("unexpected failure"), std::string::npos) << r.err;
  }
}

TEST_F(CliInputs, EmptyValuesAndGlobalFlags) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --dump-logits ''"), {"--dump-logits must not be empty"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --stop-ids ''"), {"--stop-ids must not be empty"});
  expect_clean_failure(lockstep_run("--collective-timeout 1e300 generate --backend cpu --model " + model.string() +
                                    " --prompt-ids 1"),
                       {"--collective-timeout", "1e+300"});
  expect_clean_failure(lockstep_run("--collective-timeout 0.0004 generate --backend cpu --model " + model.string() +
                                    " --prompt-ids 1"),
                       {"--collective-timeout", "0.0004"});
  const std::string long_name = (dir_ / (std::string(300, 'a') + ".npy")).string();
  expect_clean_failure(generate(model, "--prompt-ids 1 --dump-logits " + long_name), {"--dump-logits", "255 bytes"});
  // Every level the help names is taken (spdlog spells warn "warning"; both work), nothing else.
  for (const char* level : {"trace", "debug", "info", "warn", "warning", "error", "off"}) {
    CommandResult r = generate(model, std::string("--prompt-ids 1 --max-new-tokens 1 --log-level ") + level);
    EXPECT_EQ(r.exit_code, 0) << level << ": " << r.err;
  }
  expect_clean_failure(generate(model, "--prompt-ids 1 --log-level loud"), {"--log-level 'loud'"});
  // An empty prompt is a prompt (of the tokenizer's special tokens alone; this tokenizer adds none).
  CommandResult empty_prompt = generate(model, "--prompt '' --max-new-tokens 1");
  EXPECT_EQ(empty_prompt.err.find("must not be empty"), std::string::npos) << empty_prompt.err;
}

// Output lost on the way to standard output, and input that cannot be read
// from it, fail instead of passing for a run.
TEST_F(CliInputs, StandardStreamsThatFail) {
  auto model = make_model("m");
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": "{{ messages[-1].content }}"})";
  expect_clean_failure(run("sh -c '" + lockstep("generate --backend cpu --model " + model.string() + " --prompt-ids 1,2") +
                               " > /dev/full'", dir_ / "full"),
                       {"cannot write to standard output"});
  // A pipe whose reader is gone before the run starts (fd 9 for the shell): the
  // first streamed write fails (SIGPIPE is ignored), and the run stops there.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(dup2(fds[1], 9), 9);
  close(fds[0]);
  close(fds[1]);
  CommandResult closed = run("sh -c '" + lockstep("generate --backend cpu --model " + model.string() +
                                                  " --prompt hello --max-new-tokens 50 --ignore-eos") + " >&9'",
                             dir_ / "closed");
  close(9);
  expect_clean_failure(closed, {"cannot write to standard output: its reader has closed it"});
  expect_clean_failure(lockstep_run("tokenize --tokenizer " + model.string() + " --text-file - < " + model.string()),
                       {"cannot read", "standard input"});
  expect_clean_failure(lockstep_run("chat --backend cpu --model " + model.string() + " < " + model.string()),
                       {"cannot read standard input"});
  expect_clean_failure(lockstep_run("tokenize --tokenizer " + model.string() + " --text-file /dev/zero"),
                       {"/dev/zero", "is a device"});
}

// Ranks that would run different requests stop at once, naming the
// difference, instead of entering collectives of different sizes.
TEST_F(CliInputs, RanksMustAgreeOnTheRun) {
  auto model = make_model("m");
  const std::string gen = lockstep("generate --backend cpu --model " + model.string());
  CommandResult r = run(mpirun(1) + gen + " --prompt-ids 1,2 : -np 1 " + gen + " --prompt-ids 3,4,5", dir_ / "mpmd", 60);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << r.err;
  EXPECT_NE(r.err.find("the command and its requests' checksum (prompt ids and settings) differs between rank 0 and "
                       "rank(s) 1"),
            std::string::npos)
      << r.err;
  const std::string score = lockstep("score --backend cpu --model " + model.string() + " --prompt-ids 1,2 --dump-logits " +
                                     (dir_ / "s.npy").string());
  r = run(mpirun(1) + gen + " --prompt-ids 1,2 : -np 1 " + score, dir_ / "commands", 60);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the command and its requests' checksum"), std::string::npos) << r.err;
  r = run(mpirun(2) + gen + " --prompt-file /proc/self/stat", dir_ / "stat", 60);  // reads differently on each rank
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_LT(r.exit_code, 128) << r.err;
  EXPECT_NE(r.err.find("requests' checksum (prompt ids and settings) differs"), std::string::npos) << r.err;
}

TEST_F(CliInputs, ConversationsAndTemplatesWithinBounds) {
  auto model = make_model("m");
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"})";
  const std::string apply = "apply-chat-template --model " + model.string();
  const auto messages = dir_ / "m.json";
  std::ofstream(messages) << "[{\"role\": \"user\", \"content\": " << std::string(400, '[') << std::string(400, ']') << "}]";
  expect_clean_failure(lockstep_run(apply + " --messages " + messages.string()), {"nest deeper than 256"});
  std::ofstream(messages) << "[{\"role\": \"user\", \"content\": " << std::string(5000, '[') << std::string(5000, ']') << "}]";
  expect_clean_failure(lockstep_run(apply + " --messages " + messages.string()), {"deeper than 512 levels"});
  std::ofstream(messages) << R"([{"role": "user", "content": 18446744073709551615}])";
  expect_clean_failure(lockstep_run(apply + " --messages " + messages.string()), {"18446744073709551615", "64-bit"});
  // Past 64 bits nlohmann reads a double: refused as well, from every source a template sees.
  std::ofstream(messages) << R"([{"role": "user", "content": [1.5, 18446744073709551616]}])";
  expect_clean_failure(lockstep_run(apply + " --messages " + messages.string()), {"18446744073709551616", "64-bit"});
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template-kwargs '{\"n\": -99999999999999999999}'"),
                       {"--chat-template-kwargs", "-99999999999999999999", "64-bit"});
  std::ofstream(messages) << R"([{"role": "user", "content": [1e19, 2.5E3, 100]}])";  // floats as written: rendered
  EXPECT_EQ(lockstep_run(apply + " --messages " + messages.string()).exit_code, 0);
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template-kwargs '{\"messages\": []}'"),
                       {"may not set \"messages\""});
  const auto runaway = dir_ / "t.jinja";
  std::ofstream(runaway) << R"({{ range(100000)|join("x" * 100000) }})";
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template " + runaway.string()), {"64 MiB"});
  std::ofstream(runaway) << R"({{ ("x" * 1000000)|replace("x", "xxxxxxxxxx")|replace("x", "xxxxxxxxxx") }})";
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template " + runaway.string()), {"64 MiB"});
  std::ofstream(runaway) << "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}";
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template " + runaway.string()), {"1048576 items"});
  std::ofstream(runaway) << "{{ messages|tojson(indent=1000000000) }}";
  expect_clean_failure(lockstep_run(apply + " --prompt hi --chat-template " + runaway.string()), {"64 MiB"});
  std::ofstream(model / "tokenizer_config.json") << R"({"bos_token": 5, "chat_template": "{{ bos_token }}"})";
  expect_clean_failure(lockstep_run(apply + " --prompt hi"), {"tokenizer_config.json", "bos_token", "5"});
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": [{"name": 5, "template": "x"}]})";
  expect_clean_failure(lockstep_run(apply + " --prompt hi"), {"tokenizer_config.json", "chat_template entry 0"});
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": [{"name": "default", "template": 5}]})";
  expect_clean_failure(lockstep_run(apply + " --prompt hi"), {"tokenizer_config.json", "chat_template entry 0"});
  std::ofstream(model / "chat_template.jinja") << "\xff{{ messages[0].content }}";
  expect_clean_failure(lockstep_run(apply + " --prompt hi"), {"chat_template.jinja", "not valid UTF-8"});
}

// JSON nested 100000 deep anywhere in a model folder's files: nlohmann copies
// and prints values recursively, so quoting one in an error overflowed the
// stack. Every file is held to 512 levels, by name.
TEST_F(CliInputs, DeeplyNestedJsonIsRefusedByName) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const auto nest_in = [&](const std::filesystem::path& file) {
    nlohmann::json j = nlohmann::json::parse(read_file(file));
    j["deep"] = "@@";
    std::string text = j.dump();
    text.replace(text.find("\"@@\""), 4, deep);
    std::ofstream(file) << text;
  };
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    auto model = make_model(std::string("m_") + name);
    if (!std::filesystem::exists(model / name)) std::ofstream(model / name) << "{}";
    nest_in(model / name);
    const std::string chat = std::string(name) == "tokenizer_config.json" ? "--chat " : "";
    expect_clean_failure(generate(model, chat + "--prompt hi --max-new-tokens 1"), {name, "deeper than 512 levels"});
  }
  auto model = make_model("m_header");
  const auto path = model / "model.safetensors";
  const std::string bytes = read_file(path);
  uint64_t size = 0;
  std::memcpy(&size, bytes.data(), 8);
  const std::string data = bytes.substr(8 + size);  // offsets count from here: unchanged
  std::string header = bytes.substr(8, size);
  header.insert(1, "\"deep\": " + deep + ", ");
  header.append((8 - header.size() % 8) % 8, ' ');
  size = header.size();
  std::string length(8, '\0');
  std::memcpy(length.data(), &size, 8);
  std::ofstream(path, std::ios::binary) << length << header << data;
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"model.safetensors", "deeper than 512 levels"});
}

// --backend cuda where there is no GPU (CI, a laptop) names the problem; on a
// GPU machine this test has nothing to check.
TEST_F(CliInputs, CudaBackendWithoutAGpu) {
  auto model = make_model("m");
  CommandResult r = run(lockstep("generate --backend cuda --model " + model.string() + " --prompt-ids 1"), dir_ / "cuda");
  if (r.exit_code == 0) GTEST_SKIP() << "this machine has a GPU";
  const bool named = r.err.find("this host has no usable GPU") != std::string::npos ||
                     r.err.find("this build has: cpu") != std::string::npos;
  EXPECT_TRUE(named) << r.err;
  expect_clean_failure(r, {"cuda"});
}

// Sizes far past any real use: refused by name before anything is sized
// from them (they crashed, or overflowed into odd messages).
TEST_F(CliInputs, HugeSizesAreRefusedByName) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --max-step-tokens 1152921504606846976"),
                       {"--max-step-tokens", "limit"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --max-batch 9223372036854775807"), {"--max-batch", "limit"});
  const std::string bench = "bench --backend cpu --model " + model.string();
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx 9223372036854775807"), {"--ctx", "limit"});
  expect_clean_failure(lockstep_run(bench + " --prefill 8 --steps 6 --ctx 8 --batch 100000"), {"--batch", "100000"});
  expect_clean_failure(lockstep_run("make-model --out " + (dir_ / "deep").string() +
                                    " --num-layers 5000 --hidden-size 8 --num-heads 2 --num-kv-heads 1"),
                       {"num_hidden_layers", "5000"});
  expect_clean_failure(lockstep_run("make-model --out " + (dir_ / "inf").string() + " --rope-theta inf"),
                       {"rope_theta", "finite"});
  expect_clean_failure(lockstep_run("make-model --out " + (dir_ / "seed").string() + " --seed -1"), {"--seed", "-1"});
}

// User text in an error line is escaped where it is not valid UTF-8 or is a
// control character (a terminal would act on it), so the line stays one line.
TEST_F(CliInputs, ErrorLinesEscapeBadBytes) {
  auto model = make_model("m");
  CommandResult r = generate(model, "--prompt hi --stop \"$(printf '\\377')\"");  // sh's printf: octal
  expect_clean_failure(r, {"stop string '\\xff' is not valid UTF-8"});
  CommandResult newline = lockstep_run("\"$(printf 'frob\\nnicate')\"");
  expect_clean_failure(newline, {"unknown command 'frob\\x0anicate'"});
  EXPECT_EQ(std::count(newline.err.begin(), newline.err.end(), '\n'), 1) << newline.err;
  expect_clean_failure(lockstep_run("make-model --arch qwen2 --attention-bias --out " + (dir_ / "q").string()),
                       {"--attention-bias", "qwen2"});
  EXPECT_FALSE(std::filesystem::exists(dir_ / "q"));
}

// Weights larger than the memory there is are refused before anything is
// read or allocated: llama3-70b's bf16 weights (131 GiB) on this host's CPU.
// Without the check the load fills memory until an allocation fails or the
// OOM killer ends the process (a signal, which expect_clean_failure refuses).
TEST_F(CliInputs, WeightsLargerThanMemoryAreRefusedBeforeLoading) {
  std::ifstream meminfo("/proc/meminfo");
  int64_t available_kib = 0;
  for (std::string key; meminfo >> key;)
    if (key == "MemAvailable:" && meminfo >> available_kib) break;
  if (available_kib > (int64_t{131} << 20)) GTEST_SKIP() << "this host has room for a 70B model's weights (131.4 GiB)";
  CommandResult r = lockstep_run("bench --backend cpu --preset llama3-70b --batch 1 --steps 8 --ctx 8 --prefill 8");
  expect_clean_failure(r, {"out of memory", "share of the weights needs 131.", "GiB", "this host has"});
}

TEST_F(CliInputs, DetokenizeAndChatLines) {
  auto model = make_model("m");
  const std::string detok = "detokenize --tokenizer " + model.string() + " --ids ";
  expect_clean_failure(lockstep_run(detok + "' '"), {"--ids holds no token ids"});
  expect_clean_failure(lockstep_run(detok + "1,,2"), {"--ids", "empty item"});
  EXPECT_EQ(lockstep_run(detok + "'1 2' 3").exit_code, 0);
  // CRLF line endings: "/exit\r" ends the session like "/exit".
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": "{{ messages[-1].content }}"})";
  const auto input = dir_ / "crlf.txt";
  std::ofstream(input, std::ios::binary) << "hi\r\n/exit\r\nmore\r\n";
  const std::string chat = "chat --backend cpu --model " + model.string() + " --max-new-tokens 2 < ";
  CommandResult crlf = lockstep_run(chat + input.string());
  EXPECT_EQ(crlf.exit_code, 0) << crlf.err;
  std::ofstream(input, std::ios::binary) << "hi\n";
  CommandResult lf = run(lockstep(chat + input.string()), dir_ / "lf");
  EXPECT_EQ(crlf.out, lf.out) << "one reply to \"hi\", then /exit";
  const auto file = dir_ / "a_file";
  std::ofstream(file) << "x";
  expect_clean_failure(generate(model, "--prompt-ids 1 --dump-logits " + (file / "l.npy").string()),
                       {"--dump-logits", "is a file, not a folder"});
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
