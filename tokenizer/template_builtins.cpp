// The filters, tests and methods chat templates use, with Jinja2's and
// Python's meanings; any other name is refused as unsupported.
#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>

#include "common/error.h"
#include "tokenizer/template_internal.h"

namespace lockstep::jinja {

namespace {

using Kind = Value::Kind;

}  // namespace

Value arg_or(const CallArgs& a, size_t i, const char* name, const Value& fallback) {
  const Value* v = a.get(i, name);
  return v != nullptr ? *v : fallback;
}

namespace {

std::string string_arg(const CallArgs& a, size_t i, const char* name, const char* what) {
  const Value* v = a.get(i, name);
  if (v == nullptr || !v->is_string()) template_error(fmt::format("{} needs a string '{}'", what, name));
  return v->string;
}

// Python's str.strip / lstrip / rstrip: whitespace, or any of `chars`.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string text = code_points(s);
  const std::u32string set = chars.is_string() ? code_points(chars.string) : std::u32string();
  const auto strips = [&](char32_t c) {
    return chars.is_string() ? set.find(c) != std::u32string::npos : python_isspace(c);
  };
  size_t begin = 0, end = text.size();
  while (left && begin < end && strips(text[begin])) ++begin;
  while (right && end > begin && strips(text[end - 1])) --end;
  return utf8(text.substr(begin, end - begin));
}

// Python's str.split(sep=None, maxsplit=-1), and rsplit.
List split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List out;
  if (!sep.is_string()) {  // runs of whitespace, none empty; the rest after maxsplit cuts kept whole
    const std::u32string t = code_points(s);
    std::vector<std::u32string> words;
    if (!from_right) {
      for (size_t i = 0;;) {
        while (i < t.size() && python_isspace(t[i])) ++i;
        if (i == t.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(t.substr(i));
          break;
        }
        const size_t b = i;
        while (i < t.size() && !python_isspace(t[i])) ++i;
        words.push_back(t.substr(b, i - b));
      }
    } else {
      for (size_t j = t.size();;) {
        while (j > 0 && python_isspace(t[j - 1])) --j;
        if (j == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.push_back(t.substr(0, j));
          break;
        }
        const size_t e = j;
        while (j > 0 && !python_isspace(t[j - 1])) --j;
        words.push_back(t.substr(j, e - j));
      }
      std::reverse(words.begin(), words.end());
    }
    for (const auto& w : words) out.push_back(Value::from(utf8(w)));
    return out;
  }
  if (sep.string.empty()) template_error("split: empty separator");
  std::vector<std::string> parts;
  size_t start = 0, pos;
  while ((pos = s.find(sep.string, start)) != std::string::npos) {
    parts.push_back(s.substr(start, pos - start));
    start = pos + sep.string.size();
  }
  parts.push_back(s.substr(start));
  if (maxsplit >= 0 && parts.size() > static_cast<size_t>(maxsplit) + 1) {
    const size_t keep = static_cast<size_t>(maxsplit);
    std::vector<std::string> joined;
    const auto join = [&](size_t b, size_t e) {
      std::string r;
      for (size_t i = b; i < e; ++i) r += (i > b ? sep.string : "") + parts[i];
      return r;
    };
    if (from_right) {
      joined.push_back(join(0, parts.size() - keep));
      joined.insert(joined.end(), parts.end() - static_cast<std::ptrdiff_t>(keep), parts.end());
    } else {
      joined.assign(parts.begin(), parts.begin() + static_cast<std::ptrdiff_t>(keep));
      joined.push_back(join(keep, parts.size()));
    }
    parts = std::move(joined);
  }
  for (auto& p : parts) out.push_back(Value::from(std::move(p)));
  return out;
}

// Python's full case mappings that utf8proc's one-to-one ones lack (SpecialCasing.txt's
// unconditional entries for Latin): ß and the Latin ligatures, and İ lowered.
const char32_t* special_case(char32_t c, bool to_upper, bool title) {
  struct Entry {
    char32_t c;
    const char32_t* upper;
    const char32_t* title;
  };
  static constexpr Entry kEntries[] = {{0xDF, U"SS", U"Ss"},    {0xFB00, U"FF", U"Ff"},   {0xFB01, U"FI", U"Fi"},
                                       {0xFB02, U"FL", U"Fl"},  {0xFB03, U"FFI", U"Ffi"}, {0xFB04, U"FFL", U"Ffl"},
                                       {0xFB05, U"ST", U"St"},  {0xFB06, U"ST", U"St"}};
  if (!to_upper) return c == 0x130 ? U"i\u0307" : nullptr;
  for (const Entry& e : kEntries)
    if (e.c == c) return title ? e.title : e.upper;
  return nullptr;
}

}  // namespace

// Python's str.lower / upper / capitalize / title.
std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 capitalize, 3 title
  const std::u32string text = code_points(s);
  std::u32string out;
  bool previous_cased = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<utf8proc_int32_t>(text[i]);
    const bool title = (mode == 2 && i == 0) || (mode == 3 && !previous_cased);
    const bool to_upper = mode == 1 || title;
    if (const char32_t* special = special_case(text[i], to_upper, title)) {
      out += special;
    } else {
      out.push_back(static_cast<char32_t>(title ? utf8proc_totitle(c) : to_upper ? utf8proc_toupper(c) : utf8proc_tolower(c)));
    }
    previous_cased = utf8proc_toupper(c) != utf8proc_tolower(c) || utf8proc_category(c) == UTF8PROC_CATEGORY_LL ||
                     utf8proc_category(c) == UTF8PROC_CATEGORY_LU || utf8proc_category(c) == UTF8PROC_CATEGORY_LT;
  }
  return utf8(out);
}

namespace {

// Jinja's title filter (not str.title): each piece between runs of "-",
// whitespace, "(", "{", "[", "<" gets its first character upper-cased and the
// rest lower-cased.
std::string title_filter(const std::string& s) {
  const std::u32string text = code_points(s);
  const auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || python_isspace(c);
  };
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const size_t begin = i;
    const bool sep = separator(text[i]);
    while (i < text.size() && separator(text[i]) == sep) ++i;
    const std::string piece = utf8(text.substr(begin, i - begin));
    if (sep) {
      out += piece;
    } else {
      const std::u32string p = code_points(piece);
      out += map_case(utf8(p.substr(0, 1)), 1) + map_case(utf8(p.substr(1)), 0);
    }
  }
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  size_t start = 0, pos;
  int64_t done = 0;
  if (from.empty()) template_error("replace: empty pattern is not supported");
  while ((count < 0 || done < count) && (pos = s.find(from, start)) != std::string::npos) {
    check_value_bytes(out.size() + (pos - start) + to.size() + (s.size() - pos));
    out += s.substr(start, pos - start) + to;
    start = pos + from.size();
    ++done;
  }
  return out + s.substr(start);
}

bool starts_or_ends(const std::string& s, const Value& affix, bool ends) {
  const auto one = [&](const Value& a) {
    if (!a.is_string()) template_error("startswith/endswith need a string or a list of strings");
    return ends ? s.size() >= a.string.size() && s.compare(s.size() - a.string.size(), a.string.size(), a.string) == 0
                : s.compare(0, a.string.size(), a.string) == 0;
  };
  if (affix.kind == Kind::kList) return std::any_of(affix.list->begin(), affix.list->end(), one);
  return one(affix);
}

int64_t int_arg(const CallArgs& a, size_t i, const char* name, int64_t fallback) {
  const Value* v = a.get(i, name);
  if (v == nullptr || v->kind == Kind::kNone) return fallback;
  if (v->kind != Kind::kInt) template_error(fmt::format("'{}' must be an integer", name));
  return v->integer;
}

Value string_method(const std::string& s, const std::string& name) {
  using F = Function;
  if (name == "startswith" || name == "endswith")
    return Value::from(F([s, ends = name == "endswith"](const CallArgs& a) {
      const Value* affix = a.get(0, "prefix");
      if (affix == nullptr) template_error("startswith/endswith need an argument");
      return Value::from(starts_or_ends(s, *affix, ends));
    }));
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return Value::from(F([s, name](const CallArgs& a) {
      return Value::from(strip(s, arg_or(a, 0, "chars", Value::none()), name != "rstrip", name != "lstrip"));
    }));
  if (name == "split" || name == "rsplit")
    return Value::from(F([s, name](const CallArgs& a) {
      return Value::from(split(s, arg_or(a, 0, "sep", Value::none()), int_arg(a, 1, "maxsplit", -1), name == "rsplit"));
    }));
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
    const int mode = name == "lower" ? 0 : name == "upper" ? 1 : name == "capitalize" ? 2 : 3;
    return Value::from(F([s, mode](const CallArgs&) { return Value::from(map_case(s, mode)); }));
  }
  if (name == "replace")
    return Value::from(F([s](const CallArgs& a) {
      return Value::from(replace(s, string_arg(a, 0, "old", "replace"), string_arg(a, 1, "new", "replace"),
                                 int_arg(a, 2, "count", -1)));
    }));
  if (name == "find" || name == "count")
    return Value::from(F([s, name](const CallArgs& a) {
      const std::string sub = string_arg(a, 0, "sub", name.c_str());
      if (name == "find") {
        const size_t pos = s.find(sub);
        return Value::from(pos == std::string::npos ? int64_t{-1}
                                                    : static_cast<int64_t>(code_points(s.substr(0, pos)).size()));
      }
      int64_t n = 0;
      for (size_t pos = 0; !sub.empty() && (pos = s.find(sub, pos)) != std::string::npos; pos += sub.size()) ++n;
      return Value::from(n);
    }));
  if (name == "join")
    return Value::from(F([s](const CallArgs& a) {
      const Value* items = a.get(0, "iterable");
      if (items == nullptr || items->kind != Kind::kList) template_error("join needs a list");
      std::string out;
      for (size_t i = 0; i < items->list->size(); ++i) {
        if (!(*items->list)[i].is_string()) template_error("join: the list holds a non-string");
        check_value_bytes(out.size() + s.size() + (*items->list)[i].string.size());
        out += (i > 0 ? s : "") + (*items->list)[i].string;
      }
      return Value::from(std::move(out));
    }));
  return Value::undefined(name);
}

// Markup's methods: those markupsafe leaves to str, and the case and strip
// methods without arguments, whose result stays Markup; others are refused
// (markupsafe escapes their arguments).
Value markup_method(const std::string& s, const std::string& name) {
  if (string_method(s, name).is_undefined()) return Value::undefined(name);
  if (name == "startswith" || name == "endswith" || name == "find" || name == "count") return string_method(s, name);
  if (name == "lower" || name == "upper" || name == "capitalize" || name == "title" || name == "strip" ||
      name == "lstrip" || name == "rstrip") {
    const Value plain = string_method(s, name);
    return Value::from(Function([plain, name](const CallArgs& a) {
      if (!a.positional.empty() || !a.keyword.empty())
        template_error(fmt::format("{}() with arguments on an escaped (Markup) string is not supported", name));
      Value v = (*plain.function)(a);
      v.is_markup = true;
      return v;
    }));
  }
  template_error(fmt::format("the method '{}' of an escaped (Markup) string is not supported", name));
}

Value dict_method(const Value& d, const std::string& name) {
  using F = Function;
  if (name == "items" || name == "keys" || name == "values")
    return Value::from(F([d, name](const CallArgs&) {
      List out;
      for (const auto& [k, v] : *d.dict) {
        if (name == "items") {
          out.push_back(Value::from(List{Value::from(k), v}));
          out.back().is_tuple = true;  // Python's (key, value)
        } else {
          out.push_back(name == "keys" ? Value::from(k) : v);
        }
      }
      return Value::from(std::move(out));
    }));
  if (name == "get")
    return Value::from(F([d](const CallArgs& a) {
      const Value* key = a.get(0, "key");
      if (key == nullptr || !key->is_string()) return arg_or(a, 1, "default", Value::none());
      const Value* v = d.find(key->string);
      return v != nullptr ? *v : arg_or(a, 1, "default", Value::none());
    }));
  return Value::undefined(name);
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(code_points(v.string).size());
    case Kind::kList: return static_cast<int64_t>(v.list->size());
    case Kind::kDict: return static_cast<int64_t>(v.dict->size());
    default: template_error(fmt::format("a {} has no length", kind_name(v.kind)));
  }
}

}  // namespace

List as_list(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      List keys;
      for (const auto& [k, value] : *v.dict) keys.push_back(Value::from(k));
      return keys;
    }
    case Kind::kString: {
      List chars;
      for (char32_t c : code_points(v.string)) chars.push_back(Value::from(utf8(std::u32string(1, c))));
      return chars;
    }
    default: template_error(fmt::format("a {} is not iterable", kind_name(v.kind)));
  }
}


Value attribute_of(const Value& item, const Value& attribute, const Value* fallback) {
  if (attribute.kind == Kind::kInt) {
    const Value v = subscript(item, attribute);
    return fallback != nullptr && v.is_undefined() ? *fallback : v;
  }
  const std::string path = python_str(attribute);
  Value v = item;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && part.size() < 19 &&
                        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (v.is_undefined()) template_error(fmt::format("'{}' is undefined (looking up '{}')", v.undefined_name, path));
    v = subscript(v, digits ? Value::from(static_cast<int64_t>(std::stoll(part))) : Value::from(part));
    if (fallback != nullptr && v.is_undefined()) v = *fallback;
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

namespace {

// select / reject / selectattr / rejectattr.
Value select(const std::string& name, const Value& input, const CallArgs& a) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep_if = name == "select" || name == "selectattr";
  size_t next = 0;
  Value attr;
  if (by_attribute) attr = Value::from(string_arg(a, next++, "attribute", name.c_str()));
  const Value* test = a.get(next++, "test");
  CallArgs test_args;
  for (size_t i = next; i < a.positional.size(); ++i) test_args.positional.push_back(a.positional[i]);
  List out;
  for (const Value& item : as_list(input)) {
    const Value subject = by_attribute ? attribute_of(item, attr) : item;
    bool passes = test == nullptr ? subject.truthy() : false;
    if (test != nullptr) {
      if (!test->is_string()) template_error(fmt::format("{}: the test must be a name", name));
      passes = apply_test(test->string, subject, test_args);
    }
    if (passes == keep_if) out.push_back(item);
  }
  return Value::from(std::move(out));
}

Value map_filter(const Value& input, const CallArgs& a) {
  List out;
  const Value* attr = a.get(99, "attribute");
  for (const Value& item : as_list(input)) {
    if (attr != nullptr) {
      if (!attr->is_string()) template_error("map: attribute must be a string");
      Value v = attribute_of(item, *attr);
      if (v.is_undefined()) v = arg_or(a, 99, "default", v);
      out.push_back(std::move(v));
    } else {
      if (a.positional.empty() || !a.positional[0].is_string()) template_error("map needs a filter name or attribute=");
      CallArgs rest;
      rest.positional.assign(a.positional.begin() + 1, a.positional.end());
      out.push_back(apply_filter(a.positional[0].string, item, rest));
    }
  }
  return Value::from(std::move(out));
}

Value indent_filter(const Value& input, const CallArgs& a) {
  const Value width = arg_or(a, 0, "width", Value::from(int64_t{4}));
  if (width.kind == Kind::kInt) check_value_bytes(width.integer < 0 ? 0 : static_cast<size_t>(width.integer));
  // Python's " " * width: nothing for a negative width.
  const std::string pad = width.is_string() ? width.string
                                            : std::string(width.integer < 0 ? 0 : static_cast<size_t>(width.integer), ' ');
  const bool first = arg_or(a, 1, "first", Value::from(false)).truthy();
  const bool blank = arg_or(a, 2, "blank", Value::from(false)).truthy();
  const std::string s = python_str(input);
  std::string out;
  size_t start = 0;
  for (bool first_line = true; start <= s.size(); first_line = false) {
    const size_t nl = s.find('\n', start);
    const std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    check_value_bytes(out.size() + pad.size() + line.size());
    if ((!first_line || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (nl == std::string::npos) break;
    out += '\n';
    start = nl + 1;
  }
  return Value::from(std::move(out));
}

// Filters on text: trim, tojson, string, safe, case, replace, indent.
std::optional<Value> text_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "trim") return Value::from(strip(python_str(input), arg_or(a, 0, "chars", Value::none()), true, true));
  if (name == "tojson") {
    const Value indent = arg_or(a, 0, "indent", Value::none());
    return Value::from(to_json(input, indent.kind == Kind::kInt ? static_cast<int>(indent.integer) : -1));
  }
  if (name == "string") return Value::from(python_str(input));
  if (name == "safe") {  // Markup(value)
    Value marked = Value::from(python_str(input));
    marked.is_markup = true;
    return marked;
  }
  if (name == "title") return Value::from(title_filter(python_str(input)));
  if (name == "lower" || name == "upper" || name == "capitalize")
    return Value::from(map_case(python_str(input), name == "lower" ? 0 : name == "upper" ? 1 : 2));
  if (name == "replace")
    return Value::from(replace(python_str(input), string_arg(a, 0, "old", "replace"),
                               string_arg(a, 1, "new", "replace"), int_arg(a, 2, "count", -1)));
  if (name == "indent") return indent_filter(input, a);
  return std::nullopt;
}

// Filters on sequences: first, last, join, default, list, reverse, items, select..., map.
std::optional<Value> sequence_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "length" || name == "count") return Value::from(length(input));
  if (name == "first" || name == "last") {
    const List items = as_list(input);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    const Value* attr = a.get(1, "attribute");
    std::string out, sep = python_str(arg_or(a, 0, "d", Value::from("")));  // str(d): Markup or not, a plain join
    const List items = as_list(input);
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string item = python_str(attr != nullptr ? attribute_of(items[i], *attr) : items[i]);
      check_value_bytes(out.size() + sep.size() + item.size());
      out += (i > 0 ? sep : "") + item;
    }
    return Value::from(std::move(out));
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg_or(a, 1, "boolean", Value::from(false)).truthy();
    const bool use_fallback = input.is_undefined() || (boolean && !input.truthy());
    return use_fallback ? arg_or(a, 0, "default_value", Value::from("")) : input;
  }
  if (name == "list") return Value::from(as_list(input));
  if (name == "reverse") {
    if (input.is_string()) {
      std::u32string s = code_points(input.string);
      std::reverse(s.begin(), s.end());
      return Value::from(utf8(s));
    }
    List items = as_list(input);
    std::reverse(items.begin(), items.end());
    return Value::from(std::move(items));
  }
  if (name == "items") {
    if (input.is_undefined()) return Value::from(List{});
    if (input.kind != Kind::kDict) template_error("items needs a dict");
    return (*dict_method(input, "items").function)(CallArgs{});
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return select(name, input, a);
  if (name == "map") return map_filter(input, a);
  return std::nullopt;
}

// Conversions: int, float, abs.
std::optional<Value> conversion_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "int") {
    if (input.kind == Kind::kInt) return input;
    if (input.kind == Kind::kBool) return Value::from(int64_t{input.boolean});
    // int(x), else int(float(x)), as Jinja tries them; a value past 64 bits
    // (which Python would keep) stops the template.
    if (input.kind == Kind::kFloat && !std::isnan(input.number)) return Value::from(float_to_int(input.number));
    if (input.is_string()) {
      const std::string t = strip(input.string, Value::none(), true, true);
      const char* first = t.data() + (t.starts_with('+') ? 1 : 0);
      int64_t i = 0;
      const auto [end, ec] = std::from_chars(first, t.data() + t.size(), i);
      if (end == t.data() + t.size() && first != end) {
        if (ec == std::errc::result_out_of_range) template_error(fmt::format("integer overflow: int('{}') is past 64 bits", t));
        return Value::from(i);
      }
      size_t used = 0;
      try {
        const double d = std::stod(t, &used);
        if (used == t.size() && !std::isnan(d)) return Value::from(float_to_int(d));
      } catch (const std::logic_error&) {  // no number, or out of double's range
      }
    }
    return arg_or(a, 0, "default", Value::from(int64_t{0}));
  }
  if (name == "float") {
    if (input.is_number()) return Value::from(input.as_double());
    if (input.is_string()) {
      const std::string t = strip(input.string, Value::none(), true, true);
      size_t used = 0;
      try {
        const double d = std::stod(t, &used);
        if (used == t.size()) return Value::from(d);
      } catch (const std::exception&) {
      }
    }
    return arg_or(a, 0, "default", Value::from(0.0));
  }
  if (name == "abs") {
    if (input.kind == Kind::kInt) return Value::from(input.integer < 0 ? checked_neg(input.integer) : input.integer);
    return Value::from(std::fabs(input.as_double()));
  }
  return std::nullopt;
}

}  // namespace

Value method(const Value& v, const std::string& name) {
  if (v.is_markup) return markup_method(v.string, name);
  if (v.is_string()) return string_method(v.string, name);
  if (v.kind == Kind::kDict && !v.is_namespace) return dict_method(v, name);
  return Value::undefined(name);
}

Value apply_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (input.is_markup && name == "trim" && a.get(0, "chars") != nullptr)
    template_error("trim(chars) of an escaped (Markup) string is not supported");
  for (auto* filter : {text_filter, sequence_filter, conversion_filter, collection_filter, text_format_filter}) {
    if (std::optional<Value> v = filter(name, input, a)) {
      // What Markup's own methods do stays Markup (and escapes what later joins it).
      static const char* const kKeepMarkup[] = {"upper", "lower", "capitalize", "trim", "center", "indent",
                                                "truncate", "reverse", "string", "format"};
      if (input.is_markup && v->is_string() &&
          std::any_of(std::begin(kKeepMarkup), std::end(kKeepMarkup), [&](const char* k) { return name == k; }))
        v->is_markup = true;
      return *v;
    }
  }
  template_error(fmt::format("unsupported filter '{}'", name));
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& a) {
  const Value none = Value::none();
  const Value other = arg_or(a, 0, "value", none);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Kind::kNone;
  if (name == "true") return v.kind == Kind::kBool && v.boolean;
  if (name == "false") return v.kind == Kind::kBool && !v.boolean;
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "float") return v.kind == Kind::kFloat;
  if (name == "mapping") return v.kind == Kind::kDict;
  if (name == "iterable") return v.kind == Kind::kList || v.kind == Kind::kDict || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.kind == Kind::kList || v.kind == Kind::kDict || v.is_string();
  if (name == "callable") return v.kind == Kind::kFunction;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (v.kind != Kind::kInt) template_error(fmt::format("test '{}' needs an integer", name));
    if (name == "divisibleby") {
      if (other.kind != Kind::kInt || other.integer == 0) template_error("divisibleby needs a non-zero integer");
      return floor_mod(v.integer, other.integer) == 0;
    }
    return (v.integer % 2 != 0) == (name == "odd");
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other);
  if (name == "ne" || name == "!=") return !equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other);
  if (name == "le" || name == "<=") return !less(other, v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other, v);
  if (name == "ge" || name == ">=") return !less(v, other);
  if (name == "in") {
    if (other.kind == Kind::kList)
      return std::any_of(other.list->begin(), other.list->end(), [&](const Value& o) { return equal(o, v); });
    if (other.is_string() && v.is_string()) return other.string.find(v.string) != std::string::npos;
    if (other.kind == Kind::kDict && v.is_string()) return other.find(v.string) != nullptr;
    template_error("test 'in' needs a list, string or dict");
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return map_case(v.string, name == "lower" ? 0 : 1) == v.string;
  }
  if (name == "escaped") return v.is_markup;
  if (name == "sameas") {
    if (v.kind != other.kind) return false;
    if (v.kind == Kind::kNone || v.kind == Kind::kUndefined) return true;
    if (v.kind == Kind::kBool) return v.boolean == other.boolean;
    return v.list == other.list && v.dict == other.dict && v.function == other.function && equal(v, other);
  }
  template_error(fmt::format("unsupported test '{}'", name));
}

}  // namespace lockstep::jinja
