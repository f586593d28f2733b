#include "tokenizer/chat_template.h"

#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/file.h"
#include "common/json_sax.h"
#include "common/utf8.h"
#include "tokenizer/template_internal.h"

namespace lockstep {

using jinja::Value;

struct ChatTemplate::Parsed {
  jinja::Body body;
  std::map<std::string, std::string> special_tokens;
};

namespace {

std::string read_text(const std::filesystem::path& path, const char* what) { return read_whole_file(path, what); }

// A template file's text, which must be UTF-8 as Python reads it.
std::string read_template_file(const std::filesystem::path& path) {
  std::string text = read_text(path, "chat template");
  const size_t bad = find_invalid_utf8(text);
  LS_REQUIRE(bad == std::string::npos, ErrorKind::kModel, "chat template {} is not valid UTF-8 (byte offset {})",
             path.string(), bad);
  return text;
}

nlohmann::ordered_json read_json(const std::filesystem::path& path, const char* what) {
  const std::string text = read_text(path, what);
  require_json_depth(text, ErrorKind::kModel, path.string());
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LS_FAIL(ErrorKind::kModel, "{} is not valid JSON: {}", path.string(), e.what());
  }
}

// bos_token etc. of tokenizer_config.json: a string or an AddedToken object.
std::map<std::string, std::string> special_tokens(const nlohmann::ordered_json& config) {
  std::map<std::string, std::string> out;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;  // null: no such token (common for pad_token)
    if (it->is_string()) {
      out[key] = it->get<std::string>();
    } else {
      LS_REQUIRE(it->is_object() && it->contains("content") && (*it)["content"].is_string(), ErrorKind::kModel,
                 "tokenizer_config.json: {} must be a string or an object with a string \"content\", got {}", key,
                 it->dump());
      out[key] = (*it)["content"].get<std::string>();
    }
  }
  return out;
}

std::string template_of_config(const nlohmann::ordered_json& config, const std::filesystem::path& path) {
  auto it = config.find("chat_template");
  LS_REQUIRE(it != config.end() && !it->is_null(), ErrorKind::kModel,
             "{} has no chat_template (and there is no chat_template.jinja): give one with --chat-template",
             path.string());
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& entry = (*it)[i];
      LS_REQUIRE(entry.is_object() && entry.contains("name") && entry["name"].is_string() &&
                     entry.contains("template") && entry["template"].is_string(),
                 ErrorKind::kModel, "{}: chat_template entry {} is not an object with a string \"name\" and \"template\"",
                 path.string(), i);
      if (entry["name"] == "default") return entry["template"].get<std::string>();
    }
    LS_FAIL(ErrorKind::kModel, "{}: chat_template lists no template named \"default\"", path.string());
  }
  LS_FAIL(ErrorKind::kModel, "{}: chat_template must be a string or a list of named templates", path.string());
}

// Nesting deeper than any conversation's (tool calls included) is refused
// rather than followed into a stack overflow.
constexpr int kMaxValueDepth = 256;

Value to_value(const nlohmann::ordered_json& j, int depth = 0) {
  LS_REQUIRE(depth <= kMaxValueDepth, ErrorKind::kInvalidArgument,
             "chat messages or template variables nest deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::from(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::from(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      LS_REQUIRE(j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), ErrorKind::kInvalidArgument,
                 "chat messages: the integer {} is outside the templates' 64-bit range", j.dump());
      return Value::from(j.get<int64_t>());
    case nlohmann::json::value_t::number_float: return Value::from(j.get<double>());
    case nlohmann::json::value_t::string: return Value::from(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      jinja::List l;
      for (const auto& e : j) l.push_back(to_value(e, depth + 1));
      return Value::from(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      jinja::Dict d;
      for (const auto& [k, v] : j.items()) d.emplace_back(k, to_value(v, depth + 1));
      return Value::from(std::move(d));
    }
    default: LS_FAIL(ErrorKind::kInvalidArgument, "chat messages: unsupported JSON value {}", j.dump());
  }
}

std::map<std::string, Value> builtin_functions() {
  using jinja::CallArgs;
  using jinja::Function;
  std::map<std::string, Value> g;
  g["raise_exception"] = Value::from(Function([](const CallArgs& a) -> Value {
    LS_FAIL(ErrorKind::kInvalidArgument, "chat template refused the messages: {}",
            a.positional.empty() ? std::string("(no message)") : jinja::one_line(jinja::python_str(a.positional[0])));
  }));
  g["strftime_now"] = Value::from(Function([](const CallArgs& a) {
    const Value* format = a.get(0, "format");
    if (format == nullptr || !format->is_string()) jinja::template_error("strftime_now needs a format string");
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm local{};
    localtime_r(&now, &local);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof(buf), format->string.c_str(), &local);
    return Value::from(std::string(buf, n));
  }));
  g["range"] = Value::from(Function([](const CallArgs& a) {
    std::vector<int64_t> n;
    for (const Value& v : a.positional) {
      if (v.kind != Value::Kind::kInt) jinja::template_error("range needs integers");
      n.push_back(v.integer);
    }
    if (n.empty() || n.size() > 3) jinja::template_error("range takes 1 to 3 integers");
    const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1], step = n.size() == 3 ? n[2] : 1;
    if (step == 0) jinja::template_error("range step cannot be zero");
    jinja::List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      out.push_back(Value::from(i));  // jinja2's sandbox refuses ranges past MAX_RANGE as well
      if (out.size() > 100'000) jinja::template_error("range() of more than 100000 numbers");
      if (__builtin_add_overflow(i, step, &i)) break;  // past stop
    }
    return Value::from(std::move(out));
  }));
  const auto dict_of = [](bool is_namespace) {
    return Function([is_namespace](const CallArgs& a) {
      jinja::Dict d;
      for (const Value& v : a.positional)
        if (v.kind == Value::Kind::kDict) d.insert(d.end(), v.dict->begin(), v.dict->end());
      for (const auto& kv : a.keyword) d.push_back(kv);
      Value out = Value::from(std::move(d));
      out.is_namespace = is_namespace;
      return out;
    });
  };
  g["namespace"] = Value::from(dict_of(true));
  g["dict"] = Value::from(dict_of(false));
  return g;
}

}  // namespace

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

ChatTemplate ChatTemplate::from_source(const std::string& source, std::map<std::string, std::string> special) {
  ChatTemplate t;
  t.parsed_ = std::make_unique<Parsed>();
  t.parsed_->body = jinja::parse_template(source);
  t.parsed_->special_tokens = std::move(special);
  return t;
}

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  const auto config_path = model_dir / "tokenizer_config.json";
  const auto jinja_path = model_dir / "chat_template.jinja";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (path_present(config_path)) config = read_json(config_path, "tokenizer config");
  LS_REQUIRE(config.is_object(), ErrorKind::kModel, "{} is not a JSON object", config_path.string());
  if (path_present(jinja_path))
    return from_source(read_template_file(jinja_path), special_tokens(config));
  LS_REQUIRE(path_present(config_path), ErrorKind::kModel,
             "{} has neither chat_template.jinja nor tokenizer_config.json: give a template with --chat-template",
             model_dir.string());
  return from_source(template_of_config(config, config_path), special_tokens(config));
}

ChatTemplate ChatTemplate::load_file(const std::filesystem::path& template_file,
                                     const std::filesystem::path& model_dir) {
  const auto config_path = model_dir / "tokenizer_config.json";
  std::map<std::string, std::string> special;
  if (path_present(config_path)) {
    const auto config = read_json(config_path, "tokenizer config");
    if (config.is_object()) special = special_tokens(config);
  }
  return from_source(read_template_file(template_file), std::move(special));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, const ChatRenderOptions& options) const {
  LS_REQUIRE(messages.is_array(), ErrorKind::kInvalidArgument, "chat messages must be a list");
  LS_REQUIRE(options.variables.is_object(), ErrorKind::kInvalidArgument, "chat template variables must be an object");
  std::map<std::string, Value> globals = builtin_functions();
  for (const auto& [name, token] : parsed_->special_tokens) globals[name] = Value::from(token);
  globals["messages"] = to_value(messages);
  globals["add_generation_prompt"] = Value::from(options.add_generation_prompt);
  globals["tools"] = Value::none();
  globals["documents"] = Value::none();
  for (const auto& [name, value] : options.variables.items()) {
    // The conversation and the generation prompt come from their own options
    // (transformers refuses them as duplicates); "tools" and "documents" come
    // only from here, and special tokens may be replaced, as there.
    for (const char* own : {"messages", "add_generation_prompt"})
      LS_REQUIRE(name != own, ErrorKind::kInvalidArgument,
                 "--chat-template-kwargs may not set \"{}\": the conversation and its options set it", name);
    globals[name] = to_value(value);
  }
  return jinja::render(parsed_->body, globals);
}

namespace {

// A SAX pass that notes the first number written as an integer (no '.',
// 'e' or 'E') that nlohmann had to read as a double: one past 64 bits.
class WideIntegerFinder : public JsonSaxPass<nlohmann::ordered_json> {
 public:
  explicit WideIntegerFinder(const std::string& what) : what_(what) {}
  std::string found;
  bool number_float(number_float_t, const string_t& raw) override {
    if (found.empty() && raw.find_first_of(".eE") == std::string::npos) found = raw;
    return true;
  }
  [[noreturn]] void too_deep() override {
    LS_FAIL(ErrorKind::kInvalidArgument, "{} nests values deeper than {} levels", what_, kMaxJsonDepth);
  }

 private:
  const std::string& what_;
};

}  // namespace

nlohmann::ordered_json parse_template_json(const std::string& text, const std::string& what) {
  WideIntegerFinder wide(what);
  nlohmann::ordered_json::sax_parse(text, &wide);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    LS_FAIL(ErrorKind::kInvalidArgument, "{} is not valid JSON: {}", what, e.what());
  }
  LS_REQUIRE(wide.found.empty(), ErrorKind::kInvalidArgument,
             "{}: the integer {} is outside the 64-bit range", what, wide.found);
  return j;
}

void check_messages(const nlohmann::ordered_json& messages, const std::string& what) {
  LS_REQUIRE(messages.is_array() && !messages.empty(), ErrorKind::kInvalidArgument,
             "{}: expected a non-empty list of messages", what);
  for (size_t i = 0; i < messages.size(); ++i)
    LS_REQUIRE(messages[i].is_object() && messages[i].contains("role") && messages[i]["role"].is_string(),
               ErrorKind::kInvalidArgument, "{}: message {} is not an object with a string \"role\"", what, i);
}

nlohmann::ordered_json read_messages_file(const std::filesystem::path& path) {
  const std::string what = fmt::format("messages file {}", path.string());
  nlohmann::ordered_json j = parse_template_json(read_text(path, "messages file"), what);
  check_messages(j, what);
  return j;
}

}  // namespace lockstep
