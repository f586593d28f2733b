// The lockstep executable end to end: make-model, generate, score, and every
// bad input ending in one error line that names the problem and a non-zero exit.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "cli_support.h"
#include "engine/io/npy.h"
#include "engine/model_writer.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {
namespace {

using namespace testing_cli;

TEST_F(Cli, GenerateAndScoreWriteLogitsOfTheRightShape) {
  auto model = make_model("m");
  CommandResult g = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 5 --ignore-eos --dump-logits " +
                                        (dir_ / "g.npy").string());
  ASSERT_EQ(g.exit_code, 0) << g.err;
  std::istringstream ids(g.out);
  int n = 0, id;
  while (ids >> id) ++n;
  EXPECT_EQ(n, 5);
  EXPECT_EQ(read_npy(dir_ / "g.npy").shape, (std::vector<int64_t>{5, 512}));
  CommandResult s = run(lockstep("score --backend cpu --model " + model.string() + " --prompt-ids 4,5,6,7 --dump-logits " +
                                 (dir_ / "s.npy").string()),
                        dir_ / "score");
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_EQ(read_npy(dir_ / "s.npy").shape, (std::vector<int64_t>{4, 512}));
}

TEST_F(Cli, ScoreLastRowMatchesGenerateFirstRow) {
  auto model = make_model("m");
  ASSERT_EQ(generate(model, "--prompt-ids 9,8,7 --max-new-tokens 1 --ignore-eos --dump-logits " +
                                (dir_ / "g.npy").string()).exit_code, 0);
  ASSERT_EQ(run(lockstep("score --backend cpu --model " + model.string() + " --prompt-ids 9,8,7 --dump-logits " +
                         (dir_ / "s.npy").string()), dir_ / "s").exit_code, 0);
  NpyArray g = read_npy(dir_ / "g.npy"), s = read_npy(dir_ / "s.npy");
  for (size_t v = 0; v < 512; ++v) ASSERT_EQ(g.values[v], s.values[2 * 512 + v]) << v;
}

TEST_F(Cli, SampledGenerationIsReproducibleWithASeed) {
  auto model = make_model("m");
  std::string args = "--prompt-ids 1,2 --max-new-tokens 8 --ignore-eos --temperature 0.8 --top-k 50 --top-p 0.9 --seed 5";
  CommandResult a = generate(model, args), b = generate(model, args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
}

TEST_F(Cli, ShardedCheckpointGivesTheSameTokens) {
  auto single = make_model("single", "--seed 3");
  auto sharded = make_model("sharded", "--seed 3 --max-shard-bytes 60000");
  EXPECT_TRUE(std::filesystem::exists(sharded / "model.safetensors.index.json"));
  std::string args = "--prompt-ids 5,6,7 --max-new-tokens 6 --ignore-eos";
  EXPECT_EQ(generate(single, args).out, generate(sharded, args).out);
  // Both a model.safetensors and an index: the single file, as transformers
  // reads it, with a warning.
  auto other = make_model("other", "--seed 4");
  std::filesystem::copy_file(other / "model.safetensors", sharded / "model.safetensors");
  const CommandResult both = generate(sharded, args);
  EXPECT_EQ(both.out, generate(other, args).out);
  EXPECT_NE(both.err.find("reading model.safetensors"), std::string::npos) << both.err;
}

TEST_F(Cli, EveryArchitectureAndDtypeRuns) {
  for (std::string arch : {"llama", "mistral", "qwen2", "qwen3"})
    for (std::string dtype : {"bf16", "f16", "f32"}) {
      auto dir = dir_ / (arch + dtype);
      ASSERT_EQ(run(lockstep("make-model --arch " + arch + " --preset tiny --dtype " + dtype + " --out " +
                             dir.string() + " --config-style transformers5"), dir_ / "mk").exit_code, 0);
      CommandResult r = generate(dir, "--prompt-ids 1,2,3 --max-new-tokens 2 --ignore-eos");
      EXPECT_EQ(r.exit_code, 0) << arch << " " << dtype << ": " << r.err;
    }
}

TEST_F(Cli, TextPromptGoesThroughTheModelsTokenizer) {
  auto model = make_model("m");
  ASSERT_TRUE(std::filesystem::exists(model / "tokenizer.json"));
  std::ofstream(dir_ / "prompt.txt") << "Once upon a time";
  CommandResult ids = run(lockstep("tokenize --tokenizer " + model.string() + " --text-file " +
                                   (dir_ / "prompt.txt").string()), dir_ / "tok");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::string csv = ids.out.substr(0, ids.out.find('\n'));
  std::replace(csv.begin(), csv.end(), ' ', ',');
  CommandResult by_ids = generate(model, "--prompt-ids " + csv + " --max-new-tokens 6 --ignore-eos");
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.err;
  // --prompt and --prompt-file stream the same tokens as text: what the
  // stream decoder makes of them (invalid UTF-8 from a random model becomes U+FFFD).
  Tokenizer tokenizer = Tokenizer::load(model);
  StreamDecoder decoder(tokenizer);
  std::istringstream out(by_ids.out);
  std::string expected;
  for (int32_t id; out >> id;)
    if (!tokenizer.is_special(id)) expected += decoder.push(id);  // not shown in the text
  expected += decoder.flush();
  CommandResult by_text = generate(model, "--prompt 'Once upon a time' --max-new-tokens 6 --ignore-eos");
  CommandResult by_file = generate(model, "--prompt-file " + (dir_ / "prompt.txt").string() +
                                              " --max-new-tokens 6 --ignore-eos");
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  EXPECT_EQ(by_text.out, expected + "\n");
  EXPECT_EQ(by_file.out, expected + "\n");
}

// Special tokens are left out of the streamed text (as vLLM's and
// transformers' skip_special_tokens): the first generated token is made a
// special added token, and the text is then the other tokens' alone.
TEST_F(Cli, SpecialTokensAreNotShownInText) {
  auto model = make_model("m");
  const std::string args = "--prompt 'Once upon a time' --max-new-tokens 6 --ignore-eos";
  const CommandResult ids = generate(model, "--prompt-ids " + [&] {
    std::vector<int32_t> p = Tokenizer::load(model).encode("Once upon a time");
    std::string csv;
    for (int32_t id : p) {
      if (!csv.empty()) csv += ',';
      csv += std::to_string(id);
    }
    return csv;
  }() + " --max-new-tokens 6 --ignore-eos");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  std::istringstream in(ids.out);
  std::vector<int32_t> generated;
  for (int32_t id; in >> id;) generated.push_back(id);
  ASSERT_EQ(generated.size(), 6u);
  nlohmann::json tok = nlohmann::json::parse(read_file(model / "tokenizer.json"));
  tok["added_tokens"].push_back({{"id", generated[0]}, {"content", "<|marker|>"}, {"special", true},
                                 {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}});
  std::ofstream(model / "tokenizer.json") << tok.dump();
  const CommandResult text = generate(model, args);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.find("<|marker|>"), std::string::npos) << text.out;
  Tokenizer tokenizer = Tokenizer::load(model);
  ASSERT_TRUE(tokenizer.is_special(generated[0]));
  std::vector<int32_t> shown;
  for (int32_t id : generated)
    if (id != generated[0]) shown.push_back(id);
  StreamDecoder decoder(tokenizer);
  std::string expected;
  for (int32_t id : shown) expected += decoder.push(id);
  EXPECT_EQ(text.out, expected + decoder.flush() + "\n");
}

TEST_F(Cli, GenerationStopsAtTheEosId) {
  auto model = make_model("m");
  CommandResult free_run = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 8 --ignore-eos");
  ASSERT_EQ(free_run.exit_code, 0);
  std::istringstream in(free_run.out);
  std::vector<std::string> ids;
  for (std::string id; in >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 8u);
  CommandResult stopped = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 8 --stop-ids " + ids[3]);
  std::istringstream in2(stopped.out);
  std::vector<std::string> got;
  for (std::string id; in2 >> id;) got.push_back(id);
  size_t first = std::find(ids.begin(), ids.end(), ids[3]) - ids.begin();
  EXPECT_EQ(got, std::vector<std::string>(ids.begin(), ids.begin() + static_cast<long>(first) + 1));
  // One step at a time (--sync-steps) stops at the same token.
  CommandResult synced = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 8 --sync-steps --stop-ids " + ids[3]);
  ASSERT_EQ(synced.exit_code, 0) << synced.err;
  EXPECT_EQ(synced.out, stopped.out);
  // The speed line after the run counts the prompt and the tokens as printed.
  EXPECT_NE(free_run.err.find("prompt 3 tokens, 8 generated: first token after "), std::string::npos) << free_run.err;
  EXPECT_NE(free_run.err.find("prompt tok/s); 7 more in "), std::string::npos) << free_run.err;
  const std::string stopped_line = "prompt 3 tokens, " + std::to_string(first + 1) + " generated: ";
  EXPECT_NE(stopped.err.find(stopped_line), std::string::npos) << stopped.err;
}

TEST_F(Cli, PromptSourcesAreExclusive) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --prompt hi"), {"exactly one"});
  expect_clean_failure(generate(model, "--max-new-tokens 2"), {"exactly one"});
  expect_clean_failure(generate(model, "--prompt-file " + (dir_ / "none.txt").string()), {"none.txt"});
  // An empty --prompt is given (a tokenizer with a BOS would make it one
  // token); this one adds none, so the prompt is empty, not missing.
  expect_clean_failure(generate(model, "--prompt '' --max-new-tokens 2"), {"prompt is empty"});
  expect_clean_failure(generate(model, "--prompt '' --prompt-ids 1"), {"exactly one"});
}

// --prompts-file: every line one request of one batch, printed as a JSON line
// in order; each gets the tokens it gets alone (greedy), whatever --max-batch
// (continuous batching: a line takes the slot another frees) or the
// tensor-parallel size.
TEST_F(Cli, PromptsFileRunsEveryLineAsOneBatch) {
  auto model = make_model("m");
  std::ofstream(model / "tokenizer_config.json")
      << R"({"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>"})";
  std::ofstream(dir_ / "chat.json") << R"([{"role": "user", "content": "Hi"}])";
  const std::string file = (dir_ / "prompts.jsonl").string();
  std::ofstream(file) << R"({"prompt": "Once upon a time"})" << "\n"
                      << R"({"prompt_ids": [1, 2, 3]})" << "\n\n"
                      << R"({"messages": [{"role": "user", "content": "Hi"}]})" << "\n"
                      << R"({"prompt_ids": [7]})" << "\n";
  const std::string common = "--max-new-tokens 5 --ignore-eos ";
  const CommandResult all = generate(model, common + "--prompts-file " + file);
  ASSERT_EQ(all.exit_code, 0) << all.err;
  std::vector<nlohmann::json> lines;
  std::istringstream in(all.out);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 4u) << all.out;
  const auto alone = [&](const std::string& args) {
    CommandResult r = generate(model, common + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  std::string ids1;
  for (const auto& id : lines[1]["ids"]) ids1 += (ids1.empty() ? "" : " ") + std::to_string(id.get<int>());
  EXPECT_EQ(ids1 + "\n", alone("--prompt-ids 1,2,3"));
  EXPECT_EQ(lines[0]["text"].get<std::string>() + "\n", alone("--prompt 'Once upon a time'"));
  EXPECT_EQ(lines[2]["text"].get<std::string>() + "\n", alone("--messages " + (dir_ / "chat.json").string()));
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["index"], i);
    EXPECT_EQ(lines[i]["ids"].size(), 5u);
    EXPECT_FALSE(lines[i]["stopped"].get<bool>());
  }
  EXPECT_NE(all.err.find("20 tokens generated in "), std::string::npos) << all.err;  // 4 lines x 5 tokens
  EXPECT_EQ(generate(model, common + "--max-batch 3 --prompts-file " + file).out, all.out);
  const CommandResult tp2 = run(mpirun(2) + lockstep("generate --backend cpu --model " + model.string() + " " +
                                                       common + "--prompts-file " + file),
                                dir_ / "tp2");
  EXPECT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_EQ(tp2.out, all.out);
  // A line's own settings; sampled tokens do not depend on which lines share
  // a step (each line draws its bits as sequence number = its index).
  std::ofstream(file) << R"({"prompt_ids": [1, 2, 3], "temperature": 1.0, "top_k": 50, "seed": 7})" << "\n"
                      << R"({"prompt_ids": [4], "temperature": 0.8, "seed": 3})" << "\n"
                      << R"({"prompt_ids": [4], "max_new_tokens": 2})" << "\n";
  const CommandResult sampled = generate(model, common + "--prompts-file " + file);
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_EQ(generate(model, common + "--max-batch 1 --prompts-file " + file).out, sampled.out);
  EXPECT_EQ(generate(model, common + "--max-batch 2 --prompts-file " + file).out, sampled.out);
  std::istringstream sampled_lines(sampled.out);
  std::string first, second, third;
  std::getline(sampled_lines, first);
  std::getline(sampled_lines, second);
  std::getline(sampled_lines, third);
  const nlohmann::json first_line = nlohmann::json::parse(first);
  std::string ids0;
  for (const auto& id : first_line["ids"]) ids0 += (ids0.empty() ? "" : " ") + std::to_string(id.get<int>());
  EXPECT_EQ(ids0 + "\n", alone("--prompt-ids 1,2,3 --temperature 1 --top-k 50 --seed 7"));
  EXPECT_EQ(nlohmann::json::parse(third)["ids"].size(), 2u);
}

// A step holds every decoding request's token before any prompt tokens: a
// request that waited for a prefix copy and prefills the rest later sits
// before decoding requests admitted after it, and its prompt tokens once
// filled the step's limit ahead of their tokens ("batch of 257 tokens
// exceeds the step limit of 256"). 64 lines sharing a prefix, sampled.
TEST_F(Cli, PromptsFileStepsKeepTheTokenLimit) {
  auto model = make_model("m");
  const std::string file = (dir_ / "p.jsonl").string();
  {
    std::ofstream out(file);
    for (int i = 0; i < 64; ++i)
      out << nlohmann::json{{"prompt", "line " + std::to_string(i) + ": caf\u00e9 \u4e2d\u6587 ok"},
                            {"temperature", 1.0}, {"seed", i}, {"max_new_tokens", 48}}.dump() << "\n";
  }
  const std::string common = "--ignore-eos --max-step-tokens 256 --prompts-file " + file;
  const CommandResult batched = generate(model, common);
  ASSERT_EQ(batched.exit_code, 0) << batched.err;
  const CommandResult alone = generate(model, common + " --max-batch 1");
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_EQ(batched.out, alone.out);
}

// --prompts-file lines sharing a 19-token prefix prefill it once: each later
// line copies it from a slot that holds it (or finds it in its own), with the
// tokens of whole prefills, at any --max-batch and at TP=2.
TEST_F(Cli, PromptsFileSharesPrefixes) {
  auto model = make_model("m");
  const std::string file = (dir_ / "p.jsonl").string();
  write_shared_prefix_prompts(file);
  const std::string common = "--ignore-eos --prompts-file " + file + " ";
  const CommandResult whole = generate(model, common + "--no-prefix-reuse");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_NE(whole.err.find("7 requests: 161 prompt tokens, 0 of them found"), std::string::npos) << whole.err;
  for (const std::string batch : {"1", "3", "7"}) {
    const CommandResult reused = generate(model, common + "--max-batch " + batch);
    EXPECT_EQ(reused.out, whole.out) << "--max-batch " << batch;
    EXPECT_NE(reused.err.find("7 requests: 161 prompt tokens, 114 of them found"), std::string::npos) << reused.err;
  }
  const CommandResult tp2 =
      run(mpirun(2) + lockstep("generate --backend cpu --model " + model.string() + " --max-batch 3 " + common),
          dir_ / "tp2");
  EXPECT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_EQ(tp2.out, whole.out);
}

TEST_F(Cli, PromptsFileErrorsNameTheLine) {
  auto model = make_model("m");
  const auto with_lines = [&](const std::string& content) {
    const std::string file = (dir_ / "bad.jsonl").string();
    std::ofstream(file) << content;
    return generate(model, "--prompts-file " + file);
  };
  expect_clean_failure(with_lines("{\"prompt_ids\": [1]}\n{not json\n"), {"line 2", "not valid JSON"});
  expect_clean_failure(with_lines("{\"text\": \"x\"}\n"), {"line 1", "\"prompt\""});
  expect_clean_failure(with_lines("{\"prompt\": \"x\", \"prompt_ids\": [1]}\n"), {"line 1", "one of"});
  expect_clean_failure(with_lines("{\"prompt_ids\": \"1,2\"}\n"), {"line 1", "prompt_ids must be a list"});
  expect_clean_failure(with_lines("{\"prompt_ids\": [1]}\n\n{\"prompt_ids\": [1, -5]}\n"),
                       {"line 3", "outside the vocabulary"});
  // Checks that need the model name the line too, and come before any step.
  const CommandResult too_long = with_lines("{\"prompt_ids\": [1]}\n{\"prompt_ids\": [1, 2], \"max_new_tokens\": 100000}\n");
  expect_clean_failure(too_long, {"line 2", "exceeds the context length"});
  EXPECT_EQ(too_long.out, "");
  std::ofstream(model / "tokenizer_config.json") << R"({"chat_template": "{{ messages[0].content }}{{ raise_exception('bad turn') }}"})";
  expect_clean_failure(with_lines("{\"prompt_ids\": [1]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"),
                       {"line 2", "chat template refused the messages: bad turn"});
  expect_clean_failure(with_lines("\n\n"), {"holds no prompts"});
  expect_clean_failure(with_lines("{\"prompt_ids\": [1], \"temperature\": -1}\n"), {"line 1", "temperature"});
  expect_clean_failure(with_lines("{\"prompt_ids\": [1], \"max_new_tokens\": \"x\"}\n"), {"line 1", "must be an integer"});
  expect_clean_failure(with_lines("{\"prompt_ids\": [1], \"top_p\": \"x\"}\n"), {"line 1", "\"top_p\" must be a number"});
  expect_clean_failure(with_lines("{\"prompt_ids\": [1], \"max_new_tokens\": -3}\n"), {"line 1", "max_new_tokens"});
  expect_clean_failure(generate(model, "--prompts-file " + (dir_ / "none.jsonl").string()), {"none.jsonl"});
  std::ofstream(dir_ / "ok.jsonl") << "{\"prompt_ids\": [1]}\n";
  expect_clean_failure(generate(model, "--prompt-ids 1 --prompts-file " + (dir_ / "ok.jsonl").string()),
                       {"exactly one"});
  expect_clean_failure(generate(model, "--prompts-file " + (dir_ / "ok.jsonl").string() + " --dump-logits " +
                                           (dir_ / "l.npy").string()),
                       {"--dump-logits"});
}

// An output file that could not be written is refused before the run, not
// after it: nothing generated, the folder named.
TEST_F(Cli, OutputPathsAreCheckedBeforeTheRun) {
  auto model = make_model("m");
  const std::string missing = (dir_ / "no_such_folder" / "x.npy").string();
  CommandResult g = generate(model, "--prompt-ids 1,2 --max-new-tokens 2 --dump-logits " + missing);
  expect_clean_failure(g, {"--dump-logits", "no_such_folder", "does not exist"});
  EXPECT_EQ(g.out, "");
  expect_clean_failure(run(lockstep("score --backend cpu --model " + model.string() + " --prompt-ids 1,2 "
                                    "--dump-logits " + dir_.string()), dir_ / "score"),
                       {"--dump-logits", "is a folder"});
  expect_clean_failure(run(lockstep("bench --backend cpu --preset tiny --batch 1 --ctx 8 --prefill 16 --steps 6 "
                                    "--json " + (dir_ / "no_such_folder" / "b.json").string()), dir_ / "bench"),
                       {"--json", "does not exist"});
}

TEST_F(Cli, MissingModelFolder) {
  expect_clean_failure(generate(dir_ / "nope", "--prompt-ids 1"), {"model folder not found", "nope"});
  expect_clean_failure(generate(dir_ / "nope", "--prompt hi"), {"model folder not found", "nope"});
}

TEST_F(Cli, MissingWeights) {
  auto model = make_model("m");
  std::filesystem::remove(model / "model.safetensors");
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"model.safetensors"});
  // Weights in a format lockstep does not read: named, with what to do.
  std::ofstream(model / "pytorch_model.bin") << "not read";
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"pytorch_model.bin", "only safetensors", "convert"});
}

// A model folder with a SentencePiece tokenizer.model but no tokenizer.json:
// named, with what works instead.
TEST_F(Cli, TokenizerInAnotherFormat) {
  auto model = make_model("m");
  std::filesystem::rename(model / "tokenizer.json", model / "tokenizer.model");
  expect_clean_failure(generate(model, "--prompt hi"), {"tokenizer.model", "tokenizer.json only", "--prompt-ids"});
  std::filesystem::remove(model / "tokenizer.model");
  expect_clean_failure(generate(model, "--prompt hi"), {"cannot open tokenizer file"});
}

TEST_F(Cli, TruncatedSafetensors) {
  auto model = make_model("m");
  std::filesystem::resize_file(model / "model.safetensors", 100000);
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"model.safetensors"});
}

TEST_F(Cli, HugeHeaderLength) {
  auto model = make_model("m");
  std::fstream f(model / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
  uint64_t huge = 1ull << 40;
  f.write(reinterpret_cast<const char*>(&huge), 8);
  f.close();
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"header"});
}

TEST_F(Cli, ConfigShapeMismatchNamesTheTensor) {
  auto model = make_model("m");
  rewrite_config(model, [](nlohmann::json& j) { j["intermediate_size"] = 100; });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"model.layers.0.mlp.gate_proj.weight", "shape"});
}

// A sliding-window model runs past its window, and the window acts: a
// token at position p sees positions p - 3 .. p with a window of 4, so the
// first four logit rows equal the full-attention model's and the later ones
// do not (the golden fixtures check the values against transformers).
TEST_F(Cli, SlidingWindowRunsPastTheWindow) {
  std::vector<NpyArray> logits;
  for (const auto& window : {nlohmann::json(nullptr), nlohmann::json(4)}) {
    auto model = make_model(window.is_null() ? "full" : "windowed");
    rewrite_config(model, [&](nlohmann::json& j) {
      j["architectures"] = {"MistralForCausalLM"};
      j["model_type"] = "mistral";
      j["sliding_window"] = window;
    });
    const auto dump = dir_ / (window.is_null() ? "full.npy" : "windowed.npy");
    CommandResult r = run(lockstep("score --backend cpu --model " + model.string() +
                                   " --prompt-ids 5,9,2,7,11,3,8,1,6,4 --max-seq-len 12 --dump-logits " + dump.string()),
                          dir_ / "run");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    logits.push_back(read_npy(dump));
  }
  ASSERT_EQ(logits[0].shape, logits[1].shape);
  const int64_t vocab = logits[0].shape.at(1);
  for (int64_t row = 0; row < logits[0].shape.at(0); ++row) {
    const auto begin = static_cast<std::ptrdiff_t>(row * vocab);
    const bool same = std::equal(logits[0].values.begin() + begin, logits[0].values.begin() + begin + vocab,
                                 logits[1].values.begin() + begin);
    EXPECT_EQ(same, row < 4) << "row " << row;
  }
}

// --prompt puts the tokenizer's post-processor tokens (here a BOS) around the
// text unless --no-special-tokens: the same tokens as --prompt-ids with them
// (an empty text too).
TEST_F(Cli, TextPromptGetsThePostProcessorsBos) {
  auto model = make_model("m");
  const auto tok_path = model / "tokenizer.json";
  nlohmann::json t = nlohmann::json::parse(read_file(tok_path));
  const int32_t bos = Tokenizer::load(tok_path).token_id("<|begin_of_text|>").value();
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {bos}}, {"tokens", {"<|begin_of_text|>"}}}}}}};
  std::ofstream(tok_path) << t.dump();
  const std::vector<int32_t> text_ids = Tokenizer::load(tok_path).encode("Once upon a time");
  std::string text_csv;
  for (int32_t id : text_ids) text_csv.append(text_csv.empty() ? "" : ",").append(std::to_string(id));
  const std::string args = " --max-new-tokens 5 --ignore-eos";
  CommandResult with_bos = generate(model, std::string("--prompt-ids ").append(std::to_string(bos)).append(",").append(text_csv).append(args));
  CommandResult without_bos = generate(model, std::string("--prompt-ids ").append(text_csv).append(args));
  ASSERT_EQ(with_bos.exit_code, 0) << with_bos.err;
  ASSERT_EQ(without_bos.exit_code, 0) << without_bos.err;
  ASSERT_NE(with_bos.out, without_bos.out);  // the BOS changes what a random model says
  const auto as_text = [&](const std::string& ids_out) {
    Tokenizer tokenizer = Tokenizer::load(tok_path);
    StreamDecoder decoder(tokenizer);
    std::istringstream in(ids_out);
    std::string text;
    for (int32_t id; in >> id;)
      if (!tokenizer.is_special(id)) text += decoder.push(id);  // not shown in the text
    return text + decoder.flush() + "\n";
  };
  CommandResult by_text = generate(model, std::string("--prompt 'Once upon a time'").append(args));
  CommandResult raw = generate(model, std::string("--prompt 'Once upon a time' --no-special-tokens").append(args));
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  EXPECT_EQ(by_text.out, as_text(with_bos.out));
  EXPECT_EQ(raw.out, as_text(without_bos.out));
  // An empty text is the BOS alone, as Hugging Face encodes "" with add_special_tokens=True.
  CommandResult bos_only = generate(model, std::string("--prompt-ids ").append(std::to_string(bos)).append(args));
  CommandResult empty_text = generate(model, std::string("--prompt ''").append(args));
  ASSERT_EQ(empty_text.exit_code, 0) << empty_text.err;
  EXPECT_EQ(empty_text.out, as_text(bos_only.out));
}

TEST_F(Cli, ThreadsAreCheckedAndDoNotChangeTheTokens) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --threads -1"), {"--threads", "-1"});
  CommandResult one = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 8 --ignore-eos --threads 1");
  CommandResult three = generate(model, "--prompt-ids 1,2,3 --max-new-tokens 8 --ignore-eos --threads 3");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_EQ(one.out, three.out);
  EXPECT_NE(three.err.find("3 host thread(s)"), std::string::npos) << three.err;
}

// --max-step-tokens chunks a prompt's prefill; on the CPU backend the tokens
// and logits do not depend on the chunks. The default is named in the log.
TEST_F(Cli, StepTokenLimitChunksPromptsWithoutChangingTheResult) {
  auto model = make_model("m");
  const std::string prompt = "--prompt-ids 5,1,4,1,5,9,2,6,5,3,5,8,9,7,9,3,2,3,8,4 --max-new-tokens 6 --ignore-eos";
  CommandResult whole = generate(model, prompt + " --dump-logits " + (dir_ / "whole.npy").string());
  CommandResult chunked =
      generate(model, prompt + " --max-step-tokens 3 --dump-logits " + (dir_ / "chunked.npy").string());
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
  EXPECT_EQ(whole.out, chunked.out);
  EXPECT_EQ(read_file(dir_ / "whole.npy"), read_file(dir_ / "chunked.npy"));
  EXPECT_NE(whole.err.find("max_step_tokens=auto (256)"), std::string::npos) << whole.err;
  EXPECT_NE(chunked.err.find("max_step_tokens=3"), std::string::npos) << chunked.err;
  expect_clean_failure(generate(model, "--prompt-ids 1 --max-step-tokens -2"), {"--max-step-tokens", "-2"});
  CommandResult bench = run(lockstep("bench --backend cpu --model " + model.string() +
                                     " --batch 1 --ctx 8 --prefill 16 --steps 6 --max-step-tokens 5"),
                            dir_ / "bench");
  ASSERT_EQ(bench.exit_code, 0) << bench.err;
  EXPECT_NE(bench.out.find("prefill 16 tokens (steps of up to 5; 1 run)"), std::string::npos) << bench.out;
}

// The CPU backend keeps a checkpoint's product weights in its 16-bit type
// when every tensor has it, and float32 for a float32 checkpoint (that the
// products are the same is OpSizes.LinearWith16BitWeightsEqualsFloat32Weights).
TEST_F(Cli, CpuKeepsSixteenBitWeights) {
  auto bf16 = make_model("bf16");
  CommandResult r = generate(bf16, "--prompt-ids 1,2,3 --max-new-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("bfloat16 product weights"), std::string::npos) << r.err;
  auto f32 = make_model("f32", "--dtype f32");
  r = generate(f32, "--prompt-ids 1,2,3 --max-new-tokens 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("float32 product weights"), std::string::npos) << r.err;
}

TEST_F(Cli, UnsupportedArchitectureAndRope) {
  auto model = make_model("m");
  rewrite_config(model, [](nlohmann::json& j) { j["architectures"] = {"PhiForCausalLM"}; });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"PhiForCausalLM"});
  rewrite_config(model, [](nlohmann::json& j) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2.0}};
  });
  expect_clean_failure(generate(model, "--prompt-ids 1"), {"longrope"});
}

TEST_F(Cli, TokenIdsOutsideTheVocabulary) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1,512"), {"512", "vocabulary"});
  expect_clean_failure(generate(model, "--prompt-ids 1,-1"), {"-1", "vocabulary"});
  expect_clean_failure(generate(model, "--prompt-ids 1,x"), {"'x'"});
}

// A model whose vocabulary is larger than its tokenizer's (Qwen2.5 pads its
// 151665 tokens to 151936 rows): a sampled padding id shows no text, as
// Hugging Face's decode skips it, instead of ending the request.
TEST_F(Cli, GeneratedIdsPastTheTokenizerShowNoText) {
  auto model = make_model("m", "--vocab-size 1024");
  auto small = make_model("small");  // the tiny preset's 512-id tokenizer
  std::filesystem::copy_file(small / "tokenizer.json", model / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir_ / "p.jsonl") << R"({"prompt": "Once upon a time", "temperature": 1.0, "seed": 5})" << "\n";
  const CommandResult r = generate(model, "--max-new-tokens 32 --ignore-eos --prompts-file " + (dir_ / "p.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json line = nlohmann::json::parse(r.out);
  const auto ids = line["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 32u);
  EXPECT_TRUE(std::any_of(ids.begin(), ids.end(), [](int32_t id) { return id >= 512; })) << r.out;
  Tokenizer tokenizer = Tokenizer::load(model);
  StreamDecoder decoder(tokenizer);
  std::string expected;
  for (int32_t id : ids)
    if (id < 512 && !tokenizer.is_special(id)) expected += decoder.push(id);
  expected += decoder.flush();
  EXPECT_EQ(line["text"].get<std::string>(), expected);
}

TEST_F(Cli, PromptPlusNewTokensBeyondTheContext) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1,2,3,4,5 --max-new-tokens 4 --max-seq-len 8"),
                       {"exceeds the context length 8"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --max-new-tokens 600"), {"context length 512"});
}

TEST_F(Cli, BadSamplingValues) {
  auto model = make_model("m");
  expect_clean_failure(generate(model, "--prompt-ids 1 --temperature -1"), {"temperature"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --temperature inf"), {"temperature must be a finite number", "inf"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --temperature nan"), {"temperature must be a finite number", "nan"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --temperature 1 --top-p 0"), {"top-p"});
  expect_clean_failure(generate(model, "--prompt-ids 1 --temperature 1 --top-p 1.5"), {"top-p", "1.5"});
}

TEST_F(Cli, BenchRunsGreedyAndSampledAndRefusesBadValues) {
  auto model = make_model("m");
  const std::string bench = "bench --backend cpu --model " + model.string() + " --batch 1,2 --ctx 8 --prefill 16";
  CommandResult greedy = run(lockstep(bench + " --steps 6"), dir_ / "greedy");
  ASSERT_EQ(greedy.exit_code, 0) << greedy.err;
  EXPECT_NE(greedy.out.find("temperature 0 "), std::string::npos) << greedy.out;
  CommandResult sampled = run(lockstep(bench + " --steps 6 --temperature 0.8 --top-k 5 --top-p 0.9"), dir_ / "sampled");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.err;
  EXPECT_NE(sampled.out.find("temperature 0.8 top-k 5 top-p 0.9"), std::string::npos) << sampled.out;
  expect_clean_failure(run(lockstep(bench + " --steps 6 --temperature -1"), dir_ / "bad"), {"temperature"});
  expect_clean_failure(run(lockstep(bench + " --steps 3"), dir_ / "short"), {"--steps > 4"});
}

// bench --preset: random weights generated in memory, no checkpoint; the
// preset is named in the report, and bad or conflicting choices are refused.
TEST_F(Cli, BenchRunsAPresetWithoutACheckpoint) {
  const std::string bench = "bench --backend cpu --batch 1 --ctx 8 --prefill 16 --steps 6 --json " +
                            (dir_ / "b.json").string();
  CommandResult r = run(lockstep(bench + " --preset tiny --arch qwen3"), dir_ / "preset");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(read_file(dir_ / "b.json").find("\"preset tiny (qwen3)\""), std::string::npos);
  EXPECT_NE(r.err.find("model: qwen3"), std::string::npos) << r.err;
  // On the CPU the copy bandwidth is the host's and the memory its resident
  // set; a step reads the bf16 weights once (2 bytes each) and the float32
  // KV cache at the mean context (ctx 8 + steps 6 / 2 positions).
  const nlohmann::json report = nlohmann::json::parse(read_file(dir_ / "b.json"));
  EXPECT_GT(report["copy_gb_per_s"].get<double>(), 0.0);
  EXPECT_GT(report["host_memory_used_gib"].get<double>(), 0.0);
  EXPECT_FALSE(report.contains("gpu_memory_used_gib"));
  EXPECT_NE(r.out.find("host memory used (resident set)"), std::string::npos) << r.out;
  const ModelConfig c = model_preset("tiny", Arch::kQwen3);
  const double kv = static_cast<double>(c.num_kv_heads * c.head_dim), q = static_cast<double>(c.q_dim());
  const double weights =
      static_cast<double>(c.num_layers) * c.hidden_size * (2.0 * q + 2.0 * kv + 3.0 * c.intermediate_size) +
      static_cast<double>(c.vocab_size) * c.hidden_size;
  const double cache = (8 + 6 / 2.0) * 2.0 * static_cast<double>(c.num_layers) * kv;
  // One timed prefill on the CPU by default; --prefill-runs asks for more, and the median is reported.
  EXPECT_EQ(report["prefill"]["runs_seconds"].size(), 1u);
  const nlohmann::json& d = report["decode"].at(0);
  EXPECT_NEAR(d["gb_per_s"].get<double>() * d["ms_per_step"].get<double>() * 1e6, 2.0 * weights + 4.0 * cache,
              1e-9 * (2.0 * weights + 4.0 * cache))
      << d.dump();
  CommandResult three = run(lockstep(bench + " --preset tiny --prefill-runs 3"), dir_ / "three");
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_NE(three.out.find("prefill 16 tokens (steps of up to 256; median of 3 runs, "), std::string::npos)
      << three.out;
  const nlohmann::json prefill = nlohmann::json::parse(read_file(dir_ / "b.json"))["prefill"];
  std::vector<double> runs = prefill["runs_seconds"].get<std::vector<double>>();
  ASSERT_EQ(runs.size(), 3u);
  std::sort(runs.begin(), runs.end());
  EXPECT_EQ(prefill["seconds"].get<double>(), runs[1]);
  expect_clean_failure(run(lockstep(bench + " --preset huge"), dir_ / "unknown"), {"unknown preset 'huge'"});
  CommandResult both = run(lockstep(bench + " --preset tiny --model " + make_model("m").string()), dir_ / "both");
  EXPECT_NE(both.exit_code, 0) << both.err;
  EXPECT_NE(both.err.find("--model excludes --preset"), std::string::npos) << both.err;
  expect_clean_failure(run(lockstep(bench), dir_ / "neither"), {"--model is required"});
}

// bench at TP=2 on CPU ranks: each rank generates its share of the preset,
// rank 0 alone reports, and one step's all-reduces are timed on their own.
TEST_F(Cli, BenchRunsAPresetAtTpTwo) {
  CommandResult r = run(mpirun(2) + lockstep("bench --backend cpu --preset tiny --batch 1,2 --ctx 8 --prefill 16 "
                                             "--steps 6 --json " + (dir_ / "b.json").string()),
                        dir_ / "tp2", 120);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 rank(s) via mpi"), std::string::npos) << r.out;
  const nlohmann::json report = nlohmann::json::parse(read_file(dir_ / "b.json"));
  ASSERT_EQ(report["decode"].size(), 2u);
  for (const auto& d : report["decode"]) EXPECT_GT(d["collective_ms_per_step"].get<double>(), 0.0) << d.dump();
}

}  // namespace
}  // namespace lockstep
