// Chat templates: the rendering must equal Python jinja2's as transformers
// sets it up (tests/data/chat/refs, written by tests/oracle/chat_template_refs.py
// with jinja2 3.1.6), and what the Jinja subset lacks is refused by name.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <regex>

#include "cli_support.h"
#include "common/error.h"
#include "test_support.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

fs::path chat_dir() { return fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "data" / "chat"; }

std::string read_all(const fs::path& p) { return testing_cli::read_file(p); }

fs::path real_dir(const std::string& name) { return real_tokenizer_dir() / name; }

// The oracle's variants (chat_template_refs.py VARIANTS).
ChatRenderOptions variant_options(const std::string& variant) {
  ChatRenderOptions o;
  o.add_generation_prompt = variant != "nogen";
  o.variables["date_string"] = "26 Jul 2024";  // fixed (Llama 3.1/3.2 templates write today's date)
  if (variant == "nothink") o.variables["enable_thinking"] = false;
  if (variant == "withtools")
    o.variables["tools"] = ordered_json::parse(R"([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  return o;
}

TEST(ChatTemplate, RendersAsPythonJinja2Does) {
  int compared = 0;
  for (const auto& dir : fs::directory_iterator(chat_dir() / "refs")) {
    const std::string name = dir.path().filename().string();
    const fs::path fixture = chat_dir() / "templates" / (name + ".jinja");
    std::optional<ChatTemplate> chat_template;
    if (fs::exists(fixture)) {
      chat_template = ChatTemplate::from_source(read_all(fixture), {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    } else if (fs::exists(real_dir(name) / "tokenizer_config.json")) {
      chat_template = ChatTemplate::load(real_dir(name));
    } else {
      std::printf("[ info     ] %s: %s absent (scripts/fetch_tokenizers.sh), not compared\n", name.c_str(),
                  real_dir(name).c_str());
      continue;
    }
    for (const auto& ref : fs::directory_iterator(dir.path())) {
      const std::string stem = ref.path().stem().string();  // conversation.variant
      const std::string conversation = stem.substr(0, stem.find('.'));
      const std::string variant = stem.substr(stem.find('.') + 1);
      const ordered_json messages = read_messages_file(chat_dir() / "conversations" / (conversation + ".json"));
      const std::string expected = read_all(ref.path());
      ++compared;
      if (expected.rfind("ERROR: ", 0) == 0) {
        try {
          chat_template->render(messages, variant_options(variant));
          ADD_FAILURE() << name << "/" << stem << " rendered; jinja2 raised " << expected;
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
          EXPECT_NE(std::string(e.what()).find(expected.substr(7)), std::string::npos) << e.what();
        }
        continue;
      }
      EXPECT_EQ(chat_template->render(messages, variant_options(variant)), expected) << name << "/" << stem;
    }
  }
  EXPECT_GE(compared, 4 * 24) << "the fixtures' refs are missing";
}

// A template error: kModel, one line, naming `needle`.
void expect_template_error(const std::string& source, const std::string& needle, ErrorKind kind = ErrorKind::kModel) {
  try {
    const ChatTemplate t = ChatTemplate::from_source(source);
    t.render(ordered_json::parse(R"([{"role": "user", "content": "hi"}])"));
    ADD_FAILURE() << "rendered: " << source;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << source << " -> " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, RefusesWhatItCannotRenderByName) {
  expect_template_error("{% include 'other.jinja' %}", "unsupported tag 'include'");
  expect_template_error("{% raw %}x{% endraw %}", "unsupported tag 'raw'");
  expect_template_error("{{ 'a b' | urlize }}", "unsupported filter 'urlize'");
  expect_template_error("{{ 'upper' is filter }}", "unsupported test 'filter'");
  expect_template_error("{% if true %}open", "missing '{% endif %}'");
  expect_template_error("{% for m in messages %}", "endfor");
  expect_template_error("{{ 'unclosed }}", "not closed");
  expect_template_error("{{ 1 +* 2 }}", "line 1");
  expect_template_error("\n\n{{ 'a' + 1 }}", "unsupported operand types for +: 'string' and 'integer' (line 3)");
  expect_template_error("{{ nothing.attr }}", "'nothing' is undefined");
  expect_template_error("{{ messages[5].content }}", "is undefined");
  expect_template_error("{{ none.strip() }}", "a none has no attribute 'strip' (line 1)");
  expect_template_error("{% set x = 1 %}{% set x.y = 2 %}", "not a namespace");
  expect_template_error("{% for x in 5 %}{% endfor %}", "not iterable");
  expect_template_error("{{ 1 // 0 }}", "division by zero");
  expect_template_error("{{ 1 < 2 < 3 }}", "chained comparison");
  expect_template_error("{{ raise_exception('no system role, please') }}", "no system role, please",
                        ErrorKind::kInvalidArgument);
  // Still one line when what is quoted holds newlines.
  expect_template_error("{{ raise_exception('two\nlines') }}", "two\\nlines", ErrorKind::kInvalidArgument);
  expect_template_error("{{ 'a' 'b\nc' x }}", "unexpected 'x'");
  expect_template_error("{% if x %}\n{{ 1 }} {{ 'multi\nline' ]", "not closed");
  expect_template_error("{{ '\\uZZZZ' }}", "bad \\u escape");
  expect_template_error("{{ 99999999999999999999999 }}", "out of range");
}

// The filters, loop.changed and the filter and call blocks fail where
// jinja2 3.1.6 raises too (marked "jinja2 raises"), or are refused by name
// where lockstep cannot match what jinja2 renders (tests/data/chat/refs/filters
// holds what they render).
TEST(ChatTemplate, NewFiltersFailWhereTheyCannotMatchJinja2) {
  // jinja2 raises: Python cannot order these, hash these or add these.
  expect_template_error("{{ [1, 'a'] | sort }}", "sort: cannot compare");
  expect_template_error("{{ [{'a': 1}, {'a': 2}] | sort }}", "sort: cannot compare dict with dict");
  expect_template_error("{{ [[1], (1,)] | sort }}", "sort: cannot compare");
  expect_template_error("{{ [{'a': 1}, {'b': 2}] | sort(attribute='a') }}", "sort: 'a' is undefined");
  expect_template_error("{{ [{'a': {'b': 1}}, {'c': 1}] | sort(attribute='a.b') }}", "'a' is undefined");
  expect_template_error("{{ {'a': none, 'b': none} | dictsort(by='value') }}", "dictsort: cannot compare none with none");
  expect_template_error("{{ [1, 2] | dictsort }}", "dictsort needs a dict, got list");
  expect_template_error("{{ {'a': 1} | dictsort(by='size') }}", "by must be 'key' or 'value'");
  expect_template_error("{{ [1, 'a'] | max }}", "max: cannot compare");
  expect_template_error("{{ [[1], [1]] | unique | list }}", "unique: a list cannot be hashed");
  expect_template_error("{{ [{'k': 1}, {'k': 'x'}] | groupby('k') }}", "groupby: cannot compare");
  expect_template_error("{{ [1] | groupby }}", "groupby needs an attribute");
  expect_template_error("{{ ['a', 'b'] | sum }}", "sum: cannot add string to integer");
  expect_template_error("{{ [1] | sum(start='') }}", "sum: cannot sum strings");
  expect_template_error("{{ range(3) | slice(0) | list }}", "slice: zero slices");
  expect_template_error("{{ 2.5 | round(1, 'up') }}", "method must be common, ceil or floor");
  expect_template_error("{{ '2.5' | round }}", "round needs a number, got string");
  expect_template_error("{{ '%s %s' | format(1) }}", "not enough arguments");
  expect_template_error("{{ '%s' | format(1, 2) }}", "not all arguments converted");
  expect_template_error("{{ '%d' | format('x') }}", "%d needs a number, got string");
  expect_template_error("{{ '%x' | format(1.5) }}", "%x needs a number, got float");
  expect_template_error("{{ '%(a)s' | format({'a': 1}) }}", "format requires a mapping");
  expect_template_error("{{ '%(a)s %s' | format(a=1) }}", "not enough arguments");
  expect_template_error("{{ '%s' | format(1, a=2) }}", "positional and keyword arguments");
  expect_template_error("{{ '%' | format() }}", "incomplete format");
  expect_template_error("{{ 'abcdef' | truncate(2) }}", "truncate: length 2 is shorter than the end");
  expect_template_error("{{ 'abc' | truncate(5, leeway=-1) }}", "negative leeway");
  expect_template_error("{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}",
                        "macro 'm' was called from a call block but does not use caller()");
  expect_template_error("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}", "'caller' is undefined");
  expect_template_error("{% call(a) nothing() %}y{% endcall %}", "'nothing' is undefined");
  expect_template_error("{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(a) m() %}{% endcall %}",
                        "caller takes 1 arguments, got 2");
  expect_template_error("{% for x in [1] %}{{ loop.changed(v=1) }}{% endfor %}", "no keyword arguments");
  expect_template_error("{{ [1, 2] | truncate(1) }}", "truncate needs a string, got list");
  expect_template_error("{% filter nope %}x{% endfilter %}", "unsupported filter 'nope'");
  expect_template_error("{% filter wordcount %}a b{% endfilter %}", "a filter block gives a integer, not a string");
  expect_template_error("{% filter upper %}x", "missing '{% endfilter %}'");
  expect_template_error("{% call 5 %}x{% endcall %}", "a call block needs a call");
  // jinja2 renders these; lockstep refuses them by name.
  expect_template_error("{{ '%c' | format(65) }}", "the conversion '%c' is not supported");
  expect_template_error("{{ '%#x' | format(255) }}", "'#' flag is not supported");
  expect_template_error("{{ '%*d' | format(3, 1) }}", "'*' width is not supported");
  expect_template_error("{{ '%d' | format(1e300) }}", "%d of 1e+300 is not supported");
  expect_template_error("{{ 1234.5 | round(-2) }}", "negative precision");
  expect_template_error("{{ 1.5 | round(30, 'floor') }}", "precision past 22 digits");
  expect_template_error("{{ 'a &amp; b' | striptags }}", "striptags: HTML entities");
  expect_template_error("{{ ('<' | e).replace('<', '>') }}", "the method 'replace' of an escaped (Markup) string");
  expect_template_error("{{ ('<' | e).strip('<') }}", "strip() with arguments on an escaped (Markup) string");
  expect_template_error("{{ {'<' | e: 1} }}", "escaped (Markup) dict key");
  expect_template_error("{{ '<' | e | trim('<') }}", "trim(chars) of an escaped (Markup) string");
  expect_template_error("{{ 'x' | center(100000) }}", "center: a width past 10000");
  expect_template_error("{% for x in [1] recursive %}{% endfor %}", "recursive loops are not supported");
  // Python's integers have no bound; past 64 bits lockstep stops rather than
  // wrapping (INT64_MIN // -1 trapped the process). Results that fit are in
  // semantics.jinja, checked against jinja2.
  for (const char* expr : {"9223372036854775807 + 1", "(-9223372036854775807 - 2)", "4294967296 * 4294967296",
                           "-(-9223372036854775807 - 1)", "(-9223372036854775807 - 1) | abs", "2 ** 64", "3 ** 40",
                           "(-9223372036854775807 - 1) // -1", "'1e30' | int", "'99999999999999999999' | int",
                           "1e300 | int"})
    expect_template_error(std::string("{{ ") + expr + " }}", "integer overflow");
  expect_template_error("{{ [1, 2] | slice(9223372036854775807) }}", "slice: more than 1048576 slices");
  expect_template_error("{{ (-9223372036854775807 - 1) | round(method='ceil') }}", "past 2**53");
}

// Templates that would run away fail with an error, not a crash, a hang or
// memory exhaustion.
TEST(ChatTemplate, RunawayTemplatesAreStopped) {
  expect_template_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "calls nested too deeply (more than 64 levels)");
  expect_template_error("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}", "nested too deeply");
  expect_template_error("{{ " + std::string(5000, '-') + "1 }}", "nested too deeply");
  std::string nested_ifs;
  for (int i = 0; i < 1000; ++i) nested_ifs += "{% if true %}";
  expect_template_error(nested_ifs, "nested too deeply");
  expect_template_error("{{ range(1000000) | length }}", "range() of more than 100000");
  expect_template_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                        "loop iterations");
  expect_template_error("{{ 'ab' * 1000000000000 }}", "MiB");
  expect_template_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                        "MiB");
  expect_template_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "MiB");
}

TEST(ChatTemplate, StrftimeNowIsTheLocalDate) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  const ChatTemplate t = ChatTemplate::from_source("{{ strftime_now('%Y') }}");
  const std::string year = t.render(ordered_json::array());
  EXPECT_TRUE(year == std::to_string(1900 + local.tm_year) || year == std::to_string(1901 + local.tm_year)) << year;
}

TEST(ChatTemplate, LoadsFromTheModelFolder) {
  const fs::path dir = fs::temp_directory_path() / ("lockstep_chat_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const ordered_json messages = ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  try {
    ChatTemplate::load(dir);
    ADD_FAILURE() << "a folder without a template loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  // tokenizer_config.json: a string, or the entry named "default" of a list; AddedToken objects for tokens.
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>",
            "chat_template": [{"name": "tool_use", "template": "tools"},
                              {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]})";
  EXPECT_EQ(ChatTemplate::load(dir).render(messages), "<B>hi<E>");
  // chat_template.jinja (what newer transformers saves) comes first.
  std::ofstream(dir / "chat_template.jinja") << "[{{ messages | length }}]{{ bos_token }}\n";
  EXPECT_EQ(ChatTemplate::load(dir).render(messages), "[1]<B>");
  std::ofstream(dir / "mine.jinja") << "{{ eos_token }}{{ add_generation_prompt }}";
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  EXPECT_EQ(ChatTemplate::load_file(dir / "mine.jinja", dir).render(messages, no_prompt), "<E>False");
  fs::remove(dir / "chat_template.jinja");
  std::ofstream(dir / "tokenizer_config.json") << R"({"chat_template": 7})";
  EXPECT_THROW(ChatTemplate::load(dir), Error);
  std::ofstream(dir / "tokenizer_config.json") << "{not json";
  EXPECT_THROW(ChatTemplate::load(dir), Error);
  // A link looping on itself is a lockstep::Error naming the file, not a std::filesystem_error.
  fs::remove(dir / "tokenizer_config.json");
  for (const char* name : {"tokenizer_config.json", "chat_template.jinja"}) {
    fs::create_symlink(name, dir / name);
    try {
      ChatTemplate::load(dir);
      ADD_FAILURE() << name << " looping on itself loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    fs::remove(dir / name);
  }
  fs::remove_all(dir);
}

class ChatCli : public TempDirTest {};

TEST_F(ChatCli, GenerateWithChatTokenizesTheRenderedConversation) {
  using namespace testing_cli;
  const fs::path model = dir_ / "m";
  ASSERT_EQ(run(lockstep("make-model --arch qwen3 --preset tiny --out " + model.string()), dir_ / "make").exit_code, 0);
  ordered_json config = {{"eos_token", "<|end_of_text|>"},
                         {"chat_template", read_all(chat_dir() / "templates" / "chatml.jinja")}};
  std::ofstream(model / "tokenizer_config.json") << config.dump();
  const CommandResult rendered =
      run(lockstep("apply-chat-template --model " + model.string() + " --prompt 'Hi there' --system 'Be brief.'"),
          dir_ / "apply");
  ASSERT_EQ(rendered.exit_code, 0) << rendered.err;
  EXPECT_EQ(rendered.out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                          "<|im_start|>assistant\n");
  // generate --chat: the ids of the rendered text, no other special tokens.
  const std::vector<int32_t> ids = Tokenizer::load(model).encode(rendered.out);
  std::string csv;
  for (int32_t id : ids) {
    if (!csv.empty()) csv += ',';
    csv += std::to_string(id);
  }
  const std::string common = "generate --backend cpu --model " + model.string() + " --max-new-tokens 5 --ignore-eos ";
  const CommandResult by_ids = run(lockstep(common + "--prompt-ids " + csv), dir_ / "ids");
  const CommandResult by_chat =
      run(lockstep(common + "--chat --prompt 'Hi there' --system 'Be brief.' --log-level error"), dir_ / "chat");
  ASSERT_EQ(by_ids.exit_code, 0) << by_ids.err;
  ASSERT_EQ(by_chat.exit_code, 0) << by_chat.err;
  const Tokenizer tok = Tokenizer::load(model);
  StreamDecoder decoder(tok);
  std::istringstream in(by_ids.out);
  std::string text;
  for (int32_t id; in >> id;)
    if (!tok.is_special(id)) text += decoder.push(id);  // not shown in the text
  EXPECT_EQ(by_chat.out, text + decoder.flush() + "\n");
  // The same conversation from a --messages file.
  std::ofstream(dir_ / "chat.json") << R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}])";
  const CommandResult by_file = run(lockstep(common + "--messages " + (dir_ / "chat.json").string()), dir_ / "file");
  EXPECT_EQ(by_file.out, by_chat.out) << by_file.err;
}

// `lockstep chat`: each stdin line a user turn; each reply is what
// `generate --messages` gives for the conversation so far; /reset and /exit;
// under mpirun rank 0 reads and the others wait past the collective timeout.
TEST_F(ChatCli, ChatKeepsTheConversationAcrossTurns) {
  using namespace testing_cli;
  const fs::path model = dir_ / "m";
  ASSERT_EQ(run(lockstep("make-model --arch qwen3 --preset tiny --out " + model.string()), dir_ / "make").exit_code, 0);
  std::ofstream(model / "tokenizer_config.json")
      << ordered_json{{"chat_template", read_all(chat_dir() / "templates" / "chatml.jinja")}}.dump();
  const std::string common = "--backend cpu --model " + model.string() + " --max-new-tokens 6 --log-level error";
  const auto reply_to = [&](const ordered_json& messages) {
    std::ofstream(dir_ / "conversation.json") << messages.dump();
    const CommandResult r =
        run(lockstep("generate " + common + " --messages " + (dir_ / "conversation.json").string()), dir_ / "gen");
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;  // the reply and a newline
  };
  const std::string first = reply_to(ordered_json::parse(R"([{"role": "user", "content": "Hi"}])"));
  ordered_json two_turns = ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  two_turns.push_back({{"role", "assistant"}, {"content", first.substr(0, first.size() - 1)}});
  two_turns.push_back({{"role", "user"}, {"content", "How are you?"}});
  const std::string second = reply_to(two_turns);
  std::ofstream(dir_ / "in.txt") << "Hi\nHow are you?\n";
  std::string input = " < ";
  input += (dir_ / "in.txt").string();
  const CommandResult chat = run(lockstep("chat " + common) + input, dir_ / "chat");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  EXPECT_EQ(chat.out, first + second);
  // The second turn prefilled only what follows the first turn's tokens in
  // the KV cache (bit for bit the same on the CPU backend), or everything.
  const auto reused_on_turn_2 = [&](const std::string& flags) {
    std::string debug = "chat " + common + flags;
    debug.replace(debug.find("--log-level error"), 17, "--log-level debug");
    const CommandResult r = run(lockstep(debug) + input, dir_ / "debug");
    EXPECT_EQ(r.out, chat.out) << flags;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(r.err, m, std::regex("turn 2: ([0-9]+) prompt tokens, ([0-9]+) of them"))) << r.err;
    return m.size() == 3 ? std::make_pair(std::stoi(m[1]), std::stoi(m[2])) : std::make_pair(0, -1);
  };
  const auto [prompt_2, reused_2] = reused_on_turn_2("");
  EXPECT_GT(reused_2, 0);
  EXPECT_LT(reused_2, prompt_2);
  // At the end, the session's speed: the tokens prefilled (all but those reused) and generated.
  {
    std::string info = "chat " + common;
    info.replace(info.find("--log-level error"), 17, "--log-level info");
    const CommandResult r = run(lockstep(info) + input, dir_ / "info");
    EXPECT_EQ(r.out, chat.out);
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        r.err, m, std::regex("2 turns: ([0-9]+) prompt tokens prefilled \\(([0-9]+) more found in the KV cache\\), "
                             "the first tokens after [0-9.]+ ms in all \\([0-9.]+ prompt tok/s\\)")))
        << r.err;
    EXPECT_EQ(std::stoi(m[2]), reused_2);
    EXPECT_GT(std::stoi(m[1]), prompt_2 - reused_2);  // both turns' prefills
  }
  EXPECT_EQ(reused_on_turn_2(" --no-prefix-reuse").second, 0);
  // Rank 0 waits 3 s for the second line, past a 1 s collective timeout: the other rank waits too.
  std::string slow_input = "sh -c '(echo Hi; sleep 3; echo \"How are you?\") | ";
  slow_input += mpirun(2);
  slow_input += lockstep("--collective-timeout 1 chat " + common);
  slow_input += "'";
  const CommandResult tp2 = run(slow_input, dir_ / "tp2");
  EXPECT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_EQ(tp2.out, chat.out);
  std::ofstream(dir_ / "in.txt") << "Hi\n/reset\nHi\n/exit\nnot read\n";
  EXPECT_EQ(run(lockstep("chat " + common) + input, dir_ / "reset").out, first + first);
  // A template that indexes messages[0] (fine for any real conversation) is accepted.
  std::ofstream(dir_ / "strict.jinja") << "{% if messages[0].role == 'system' %}S{% endif %}{{ messages[-1].content }}";
  EXPECT_EQ(run(lockstep("chat " + common + " --chat-template " + (dir_ / "strict.jinja").string()) + input,
                dir_ / "strict").exit_code, 0);
  // A turn that does not fit the context is refused with one error line; the
  // session goes on, and its exit status reports the refused turn.
  std::ofstream(dir_ / "in.txt") << std::string(300, 'x') << "\nHi\n";
  const CommandResult full = run(lockstep("chat " + common + " --max-seq-len 128") + input, dir_ / "full");
  EXPECT_EQ(full.exit_code, 1) << full.err;
  EXPECT_NE(full.err.find("fills the context"), std::string::npos) << full.err;
  EXPECT_EQ(full.out, first);
  // So is a line that is not valid UTF-8.
  std::ofstream(dir_ / "in.txt") << "ok \xff\xfe\nHi\n";
  const CommandResult bad = run(lockstep("chat " + common) + input, dir_ / "bad_utf8");
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.err.find("chat line 1 is not valid UTF-8 (byte offset 3): the turn is skipped"), std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.out, first);
}

TEST_F(ChatCli, BadChatInputsFailCleanly) {
  using namespace testing_cli;
  const fs::path model = dir_ / "m";
  ASSERT_EQ(run(lockstep("make-model --arch llama --preset tiny --out " + model.string()), dir_ / "make").exit_code, 0);
  const auto fails_with = [&](const std::string& args, const std::string& needle) {
    const CommandResult r = run(lockstep(args), dir_ / "bad");
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_LT(r.exit_code, 128) << args << ": " << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  };
  const std::string gen = "generate --backend cpu --model " + model.string() + " ";
  fails_with(gen + "--chat --prompt hi", "--chat-template");  // no template in the folder
  fails_with("chat --backend cpu --model " + model.string() + " < /dev/null", "--chat-template");
  fails_with("chat --backend cpu --model " + model.string() + " --max-new-tokens 0 < /dev/null", "--max-new-tokens");
  fails_with(gen + "--prompt hi --system x", "need --chat");
  fails_with(gen + "--chat --prompt-ids 1,2", "--chat needs");
  std::ofstream(dir_ / "t.jinja") << "{{ messages[0].content }}{% if %}";
  fails_with(gen + "--chat --prompt hi --chat-template " + (dir_ / "t.jinja").string(), "chat template");
  std::ofstream(dir_ / "ok.jinja") << "{{ messages[0].content }}";
  fails_with(gen + "--chat --prompt hi --chat-template " + (dir_ / "ok.jinja").string() +
                 " --chat-template-kwargs '[1]'", "JSON object");
  std::ofstream(dir_ / "bad.json") << R"([{"content": "no role"}])";
  fails_with(gen + "--messages " + (dir_ / "bad.json").string(), "role");
  fails_with(gen + "--messages " + (dir_ / "bad.json").string() + " --prompt hi", "exactly one");
  std::ofstream(dir_ / "broken.json") << "[{";
  fails_with("apply-chat-template --model " + model.string() + " --messages " + (dir_ / "broken.json").string(),
             "not valid JSON");
  fails_with("apply-chat-template --model " + model.string(), "apply-chat-template needs --prompt or --messages");
}

}  // namespace
}  // namespace lockstep
