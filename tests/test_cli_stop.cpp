// Stop strings end to end (--stop, a --prompts-file line's "stop", chat):
// the text ends just before the earliest stop string, the request ends with
// the token that completed it, and streaming never shows what a stop string
// takes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {
namespace {

using namespace testing_cli;

// `text` as one shell word, byte for byte.
std::string quoted(const std::string& text) {
  std::string word = "'";
  for (char c : text) word += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return word + "'";
}

struct Output {
  std::vector<int32_t> ids;
  std::string text;
  bool stopped = false;
};

class CliStop : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    model_ = make_model("m");
    tokenizer_.emplace(Tokenizer::load(model_));
  }
  // The --prompts-file lines' outputs.
  std::vector<Output> run_lines(const std::vector<nlohmann::json>& lines, const std::string& flags,
                                const std::string& launcher = "") {
    std::ofstream file(dir_ / "lines.jsonl");
    for (const auto& line : lines) file << line.dump() << "\n";
    file.close();
    const CommandResult r = run(launcher + lockstep("generate --backend cpu --model " + model_.string() +
                                                    " --prompts-file " + (dir_ / "lines.jsonl").string() + " " + flags),
                                dir_ / "lines");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<Output> outputs;
    std::istringstream in(r.out);
    for (std::string text; std::getline(in, text);) {
      const nlohmann::json j = nlohmann::json::parse(text);
      outputs.push_back({.ids = j["ids"].get<std::vector<int32_t>>(), .text = j["text"], .stopped = j["stopped"]});
    }
    EXPECT_EQ(outputs.size(), lines.size()) << r.out;
    return outputs;
  }
  // The streamed text of the first n ids (special tokens left out, incomplete UTF-8 held back).
  std::string text_of(const std::vector<int32_t>& ids, size_t n) const {
    StreamDecoder decoder(*tokenizer_);
    std::string text;
    for (size_t i = 0; i < n; ++i)
      if (!tokenizer_->is_special(ids[i])) text += decoder.push(ids[i]);
    return text;
  }
  // A stop string over `tokens` of the ids from the k-th: the last character
  // of id k's text, the text of those after it and the first character of
  // the last one's.
  std::string spanning(const std::vector<int32_t>& ids, size_t k, size_t tokens) const {
    const std::string before = text_of(ids, k), through_k = text_of(ids, k + 1);
    const std::string inner = text_of(ids, k + tokens - 1), after = text_of(ids, k + tokens);
    EXPECT_LT(before.size(), through_k.size()) << "id " << k << " shows no text";
    EXPECT_LT(inner.size(), after.size()) << "id " << k + tokens - 1 << " shows no text";
    size_t begin = through_k.size() - 1;
    while (begin > 0 && (static_cast<unsigned char>(through_k[begin]) & 0xC0) == 0x80) --begin;
    size_t end = inner.size() + 1;
    while (end < after.size() && (static_cast<unsigned char>(after[end]) & 0xC0) == 0x80) ++end;
    return after.substr(begin, end - begin);
  }
  // How many of the ids a request with these stop strings generates: up to
  // the one whose text first holds one of them.
  size_t ids_until(const std::vector<int32_t>& ids, const std::vector<std::string>& stops) const {
    for (size_t n = 1; n <= ids.size(); ++n)
      for (const std::string& stop : stops)
        if (text_of(ids, n).find(stop) != std::string::npos) return n;
    return ids.size();
  }
  CommandResult generate_text(const std::string& flags) {
    return generate(model_, "--prompt 'Once upon a time' --max-new-tokens 16 --ignore-eos --log-level error " + flags);
  }
  static nlohmann::json prompt_line() { return {{"prompt", "Once upon a time"}}; }
  static constexpr const char* kFlags = "--max-new-tokens 16 --ignore-eos --log-level error";

  std::filesystem::path model_;
  std::optional<Tokenizer> tokenizer_;
};

// A stop string over two tokens, then over four: the text ends right before
// it, the ids end with the token that completed it (no more), the request
// counts as stopped, and the streamed text never showed the start of the stop
// string that the ids before the last had already made.
TEST_F(CliStop, TextEndsBeforeTheStopString) {
  const Output free = run_lines({prompt_line()}, kFlags).at(0);
  ASSERT_EQ(free.ids.size(), 16u);
  ASSERT_FALSE(free.stopped);
  for (const size_t tokens : {2, 4}) {
    const std::string stop = spanning(free.ids, 2, tokens);
    const size_t n = ids_until(free.ids, {stop});
    const std::string expected = free.text.substr(0, free.text.find(stop));
    ASSERT_LT(n, free.ids.size()) << "'" << stop << "' in '" << free.text << "'";
    ASSERT_GT(text_of(free.ids, n - 1).size(), expected.size()) << "nothing to hold back";
    const Output stopped = run_lines({prompt_line()}, std::string(kFlags) + " --stop " + quoted(stop)).at(0);
    EXPECT_EQ(stopped.ids, std::vector<int32_t>(free.ids.begin(), free.ids.begin() + static_cast<long>(n)));
    EXPECT_EQ(stopped.text, expected);
    EXPECT_TRUE(stopped.stopped);
    for (const std::string sync : {"", "--sync-steps"}) {
      const CommandResult streamed = generate_text(sync + " --stop " + quoted(stop));
      ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
      EXPECT_EQ(streamed.out, expected + "\n") << tokens << " tokens " << sync;
    }
  }
}

// A stop string that never occurs changes nothing, even one that the end
// of the text starts (held back to the end, then shown).
TEST_F(CliStop, StopStringsThatNeverOccurChangeNothing) {
  const Output free = run_lines({prompt_line()}, kFlags).at(0);
  size_t begin = free.text.size() - 5;
  while ((static_cast<unsigned char>(free.text[begin]) & 0xC0) == 0x80) --begin;
  const std::string tail = free.text.substr(begin) + "~never";
  ASSERT_EQ(free.text.find(tail), std::string::npos);
  const std::string flags = " --stop 'not in the text' --stop " + quoted(tail);
  const Output with_stops = run_lines({prompt_line()}, kFlags + flags).at(0);
  EXPECT_EQ(with_stops.ids, free.ids);
  EXPECT_EQ(with_stops.text, free.text);
  EXPECT_FALSE(with_stops.stopped);
  EXPECT_EQ(generate_text(flags).out, free.text + "\n");
}

// Of several stop strings, the one that occurs first ends the text, whatever
// the order they are given in.
TEST_F(CliStop, EarliestStopStringWins) {
  const Output free = run_lines({prompt_line()}, kFlags).at(0);
  const std::string early = spanning(free.ids, 1, 2), late = spanning(free.ids, 12, 2);
  ASSERT_LT(free.text.find(early), free.text.find(late));
  const std::string cut_early = free.text.substr(0, free.text.find(early));
  EXPECT_EQ(generate_text("--stop " + quoted(late) + " --stop " + quoted(early)).out, cut_early + "\n");
  EXPECT_EQ(generate_text("--stop " + quoted(early) + " --stop " + quoted(late)).out, cut_early + "\n");
  EXPECT_EQ(generate_text("--stop " + quoted(late)).out, free.text.substr(0, free.text.find(late)) + "\n");
}

// A --prompts-file line's "stop" (a string or a list) replaces --stop for
// that line; "prompt_ids" lines with stop strings get a text too. The same at
// any --max-batch and at TP=2 (every rank stops alike).
TEST_F(CliStop, PromptsFileLinesHaveTheirOwnStopStrings) {
  const Output free = run_lines({prompt_line()}, kFlags).at(0);
  const std::string early = spanning(free.ids, 1, 2), late = spanning(free.ids, 12, 2);
  const std::string cut_early = free.text.substr(0, free.text.find(early));
  const std::string cut_late = free.text.substr(0, free.text.find(late));
  ASSERT_NE(cut_early, cut_late);
  const std::vector<int32_t> prompt_ids = tokenizer_->with_special_tokens(tokenizer_->encode("Once upon a time"));
  std::vector<nlohmann::json> lines(5, prompt_line());
  lines[0]["stop"] = early;
  lines[1]["stop"] = {"not in the text", late};
  lines[3]["stop"] = nlohmann::json::array();
  lines[4] = {{"prompt_ids", prompt_ids}, {"stop", {early}}};
  const std::string flags = std::string(kFlags) + " --stop " + quoted(late);
  const std::vector<Output> out = run_lines(lines, flags);
  ASSERT_EQ(out.size(), 5u);
  const std::vector<std::string> texts = {cut_early, cut_late, cut_late, free.text, cut_early};
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].text, texts[i]) << "line " << i + 1;
    EXPECT_EQ(out[i].stopped, i != 3) << "line " << i + 1;
    const auto kept = static_cast<long>(out[i].ids.size());
    EXPECT_EQ(out[i].ids, std::vector<int32_t>(free.ids.begin(), free.ids.begin() + kept)) << "line " << i + 1;
  }
  EXPECT_EQ(out[0].ids.size(), ids_until(free.ids, {early}));
  EXPECT_EQ(out[1].ids.size(), ids_until(free.ids, {late}));
  for (const std::string& launcher : {std::string(), mpirun(2)}) {
    const std::vector<Output> again = run_lines(lines, flags + " --max-batch 2", launcher);
    for (size_t i = 0; i < again.size() && i < out.size(); ++i) {
      EXPECT_EQ(again[i].ids, out[i].ids) << "line " << i + 1 << " " << launcher;
      EXPECT_EQ(again[i].text, out[i].text) << "line " << i + 1 << " " << launcher;
    }
  }
}

// `chat --stop`: each reply ends before the stop string, and the conversation
// keeps that text, as `generate --messages` of the conversation so far
// gives it, with the KV cache of the turn before or without it.
TEST_F(CliStop, ChatRepliesEndBeforeTheStopString) {
  const auto chatml = std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "tests/data/chat/templates/chatml.jinja";
  std::ofstream(model_ / "tokenizer_config.json") << nlohmann::json{{"chat_template", read_file(chatml)}}.dump();
  const nlohmann::json hi = nlohmann::json::parse(R"([{"role": "user", "content": "Hi"}])");
  const std::string flags = "--max-new-tokens 12 --log-level error";
  const Output free = run_lines({{{"messages", hi}}}, flags).at(0);
  ASSERT_GE(free.ids.size(), 6u) << "the reply ended on an eos";
  const std::string stop = spanning(free.ids, 2, 2);
  const auto reply_to = [&](const nlohmann::json& messages) {
    std::ofstream(dir_ / "conversation.json") << messages.dump();
    const CommandResult r = generate(model_, flags + " --stop " + quoted(stop) + " --messages " +
                                                 (dir_ / "conversation.json").string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;  // the reply and a newline
  };
  const std::string first = reply_to(hi);
  ASSERT_EQ(first, free.text.substr(0, free.text.find(stop)) + "\n");
  nlohmann::json two_turns = hi;
  two_turns.push_back({{"role", "assistant"}, {"content", first.substr(0, first.size() - 1)}});
  two_turns.push_back({{"role", "user"}, {"content", "How are you?"}});
  const std::string second = reply_to(two_turns);
  std::ofstream(dir_ / "in.txt") << "Hi\nHow are you?\n";
  for (const std::string reuse : {"", " --no-prefix-reuse"}) {
    const CommandResult chat = run(lockstep("chat --backend cpu --model " + model_.string() + " " + flags + reuse +
                                            " --stop " + quoted(stop) + " < " + (dir_ / "in.txt").string()),
                                   dir_ / "chat");
    ASSERT_EQ(chat.exit_code, 0) << chat.err;
    EXPECT_EQ(chat.out, first + second) << reuse;
  }
}

// An empty stop string, a "stop" that is not a string or a list of them,
// and --stop without a text prompt are refused before any step.
TEST_F(CliStop, BadStopStringsAreRefused) {
  CommandResult r = generate(model_, "--prompt hi --stop x --stop ''");
  expect_clean_failure(r, {"--stop", "stop string is empty"});
  EXPECT_EQ(r.out, "");
  expect_clean_failure(run(lockstep("chat --backend cpu --model " + model_.string() + " --stop '' < /dev/null"),
                           dir_ / "chat"),
                       {"--stop", "stop string is empty"});
  expect_clean_failure(generate(model_, "--prompt-ids 1,2 --stop x"), {"--stop needs a text prompt"});
  const auto with_lines = [&](const std::string& content) {
    std::ofstream(dir_ / "bad.jsonl") << content;
    return generate(model_, "--prompts-file " + (dir_ / "bad.jsonl").string());
  };
  for (const std::string stop : {"5", "[\"a\", 3]", "{\"a\": 1}", "null"})
    expect_clean_failure(with_lines("{\"prompt\": \"x\"}\n{\"prompt\": \"x\", \"stop\": " + stop + "}\n"),
                         {"line 2", "\"stop\" must be a string or a list of strings"});
  for (const std::string stop : {"\"\"", "[\"a\", \"\"]"}) {
    r = with_lines("{\"prompt\": \"x\", \"stop\": " + stop + "}\n");
    expect_clean_failure(r, {"line 1", "stop string is empty"});
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
}  // namespace lockstep
