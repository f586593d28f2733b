// Chat templates: a model's Jinja template rendered over a conversation, as
// transformers' apply_chat_template(tokenize=False) renders it.
//
// The template comes from the model folder's chat_template.jinja, else from
// tokenizer_config.json's "chat_template" (a string, or the entry named
// "default" of a list of named templates), or from a file given by the user.
// It sees what transformers passes: messages, add_generation_prompt, tools
// and documents (none), the special tokens of tokenizer_config.json
// (bos_token, eos_token, unk_token, pad_token), any extra variables, and the
// functions raise_exception and strftime_now.
//
// The Jinja subset: text with "-"/"+" whitespace control under trim_blocks
// and lstrip_blocks; {{ }} expressions with literals, lists, dicts, attribute
// and item access, slices, calls, filters, tests, arithmetic, comparisons,
// in, and/or/not, inline if/else; if/elif/else, for (with else, a filter,
// loop.* including changed() and depth, break, continue), set (names,
// tuples, namespace attributes, blocks), macro, call blocks with caller(),
// filter blocks, generation; the filters, tests and string/dict methods
// templates use (template_builtins.cpp), and sort, dictsort, min, max,
// unique, groupby, sum, batch, slice, round (template_filters.cpp), format
// (Python's %-formatting without %c, '#' and '*'), truncate, center,
// wordcount, striptags (without entities), escape / e / forceescape and the
// escaped test (markupsafe's Markup, which escapes what is added to it),
// attr (template_text_filters.cpp). Strings sort case-insensitively unless
// case_sensitive, as in Jinja2; what Python cannot order or add fails. Not
// supported: recursive loops, include / import / extends / raw, and the
// filters random, pprint, urlize, urlencode, filesizeformat, xmlattr and
// wordwrap. Anything else is refused with a
// one-line kModel error naming it; raise_exception fails with
// kInvalidArgument and the template's message. A template that would run
// away is stopped with an error: expressions or blocks nested past 256,
// macros past 64 calls deep, range() past 100000 numbers (as jinja2's
// sandbox), a million loop iterations, a value or output past 64 MiB.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace lockstep {

namespace jinja {
struct Node;
}

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  // Extra template variables (vLLM's chat_template_kwargs, e.g. {"enable_thinking": false}).
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // The model folder's template (see above); throws kModel when it has none.
  static ChatTemplate load(const std::filesystem::path& model_dir);
  // A template file of the user's, with the model folder's special tokens.
  static ChatTemplate load_file(const std::filesystem::path& template_file, const std::filesystem::path& model_dir);
  // Template source and special tokens given directly (tests).
  static ChatTemplate from_source(const std::string& source, std::map<std::string, std::string> special_tokens = {});

  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // `messages`: a JSON list of message objects ({"role": ..., "content": ...}, any other keys kept).
  std::string render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options = {}) const;

 private:
  ChatTemplate() = default;
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
};

// Parses JSON that a template or a request will see (messages, template
// variables, prompts-file lines), refusing integers past 64 bits by name:
// nlohmann would read them as doubles, and a template would print
// 1.8446744073709552e+19 where Python prints the integer. `what` names the
// source in errors.
nlohmann::ordered_json parse_template_json(const std::string& text, const std::string& what);

// A conversation: a non-empty list of messages, each an object with a string
// "role" (and usually "content"); throws kInvalidArgument naming `what` and
// the message that is wrong.
void check_messages(const nlohmann::ordered_json& messages, const std::string& what);

// A conversation from a JSON file, checked as check_messages does.
nlohmann::ordered_json read_messages_file(const std::filesystem::path& path);

}  // namespace lockstep
