// The text filters beyond the everyday ones: format (Python's %-formatting),
// truncate, center, wordcount, striptags, escape / e / forceescape
// (markupsafe's Markup) and attr, with Jinja2 3.1's and Python's meanings;
// what they cannot match is refused by name.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "tokenizer/template_internal.h"

namespace lockstep::jinja {

namespace {

using Kind = Value::Kind;

constexpr int64_t kMaxFormatWidth = 10000;  // widths and precisions of format and center

Value markup(std::string s) {
  Value v = Value::from(std::move(s));
  v.is_markup = true;
  return v;
}

// `text` padded with spaces to `width` code points: on the left, or the right when `left_align`.
std::string pad(const std::string& text, int64_t width, bool left_align) {
  const auto size = static_cast<int64_t>(code_points(text).size());
  if (size >= width) return text;
  const std::string spaces(static_cast<size_t>(width - size), ' ');
  return left_align ? text + spaces : spaces + text;
}

// One %-conversion: %(name) flags width .precision type.
struct Conversion {
  std::string name;  // %(name)s; empty for the next positional argument
  bool has_name = false;
  std::string flags;
  int64_t width = 0;
  int64_t precision = -1;
  char type = 0;
  bool flag(char f) const { return flags.find(f) != std::string::npos; }
};

// Parses the conversion after the '%' at `format[pos - 1]`, leaving `pos` after it.
Conversion parse_conversion(const std::string& format, size_t& pos) {
  Conversion c;
  const auto number = [&](const char* what) {
    int64_t n = 0;
    if (pos < format.size() && format[pos] == '*') template_error(fmt::format("format: '*' {} is not supported", what));
    while (pos < format.size() && format[pos] >= '0' && format[pos] <= '9') {
      n = n * 10 + (format[pos++] - '0');
      if (n > kMaxFormatWidth) template_error(fmt::format("format: a {} past {} is not supported", what, kMaxFormatWidth));
    }
    return n;
  };
  if (pos < format.size() && format[pos] == '(') {
    const size_t close = format.find(')', pos);
    if (close == std::string::npos) template_error("format: incomplete format key");
    c.name = format.substr(pos + 1, close - pos - 1);
    c.has_name = true;
    pos = close + 1;
  }
  while (pos < format.size() && std::string_view("-+ #0").find(format[pos]) != std::string_view::npos)
    c.flags.push_back(format[pos++]);
  c.width = number("width");
  if (pos < format.size() && format[pos] == '.') {
    ++pos;
    c.precision = number("precision");
  }
  while (pos < format.size() && (format[pos] == 'h' || format[pos] == 'l' || format[pos] == 'L')) ++pos;
  if (pos >= format.size()) template_error("format: incomplete format");
  c.type = format[pos++];
  if (c.flag('#')) template_error("format: the '#' flag is not supported");
  return c;
}

// Python's %d / %x / %X / %o of an integer: sign, digits, precision zeros, width.
std::string format_integer(const Conversion& c, int64_t value) {
  const unsigned base = c.type == 'x' || c.type == 'X' ? 16 : c.type == 'o' ? 8 : 10;
  const char* digit_chars = c.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  uint64_t magnitude = value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::string digits;
  do digits.insert(digits.begin(), digit_chars[magnitude % base]);
  while ((magnitude /= base) != 0);
  if (c.precision > static_cast<int64_t>(digits.size()))
    digits.insert(0, static_cast<size_t>(c.precision) - digits.size(), '0');
  const std::string sign = value < 0 ? "-" : c.flag('+') ? "+" : c.flag(' ') ? " " : "";
  if (c.flag('0') && !c.flag('-') && static_cast<int64_t>(sign.size() + digits.size()) < c.width)
    digits.insert(0, static_cast<size_t>(c.width) - sign.size() - digits.size(), '0');
  return pad(sign + digits, c.width, c.flag('-'));
}

// Python's %f / %e / %g (C's printf, which rounds the same way).
std::string format_float(const Conversion& c, double value) {
  const std::string spec = c.precision >= 0 ? fmt::format("%{}{}.{}{}", c.flags, c.width, c.precision, c.type)
                                           : fmt::format("%{}{}{}", c.flags, c.width, c.type);
  std::vector<char> text(static_cast<size_t>(2 * kMaxFormatWidth + 400));
  std::snprintf(text.data(), text.size(), spec.c_str(), value);
  return text.data();
}

// One conversion of `arg`; `escape` when the format string is Markup (its
// arguments are escaped unless Markup themselves).
std::string convert(const Conversion& c, const Value& arg, bool escape) {
  // Markup's helper escapes str(arg) unless arg is Markup, and repr(arg) always.
  const auto escaped = [&](std::string s) { return escape && !(c.type == 's' && arg.is_markup) ? html_escape(s) : s; };
  switch (c.type) {
    case 's':
    case 'r': {
      std::u32string text = code_points(escaped(c.type == 's' ? python_str(arg) : python_repr(arg)));
      if (c.precision >= 0 && static_cast<int64_t>(text.size()) > c.precision) text.resize(static_cast<size_t>(c.precision));
      return pad(utf8(text), c.width, c.flag('-'));
    }
    case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
      const bool decimal = c.type == 'd' || c.type == 'i' || c.type == 'u';
      if (arg.kind == Kind::kFloat && decimal) {
        if (!std::isfinite(arg.number) || std::fabs(arg.number) >= 9.2e18)
          template_error(fmt::format("format: %{} of {} is not supported", c.type, python_str(arg)));
        return format_integer(c, float_to_int(arg.number));
      }
      if (arg.kind != Kind::kInt && arg.kind != Kind::kBool)
        template_error(fmt::format("format: %{} needs a number, got {}", c.type, kind_name(arg.kind)));
      return format_integer(c, arg.kind == Kind::kBool ? int64_t{arg.boolean} : arg.integer);
    }
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G':
      if (!arg.is_number()) template_error(fmt::format("format: %{} needs a number, got {}", c.type, kind_name(arg.kind)));
      return format_float(c, arg.as_double());
    default: template_error(fmt::format("format: the conversion '%{}' is not supported", c.type));
  }
}

// format(*args) / format(**kwargs): `format % args` (a tuple) or `format % kwargs` (a dict).
Value format_filter(const Value& input, const CallArgs& a) {
  if (!a.positional.empty() && !a.keyword.empty())
    template_error("format: can't handle positional and keyword arguments at the same time");
  const bool mapping = !a.keyword.empty();
  Dict keywords(a.keyword.begin(), a.keyword.end());
  const Value whole = Value::from(keywords);  // what an unnamed conversion takes from a mapping
  const std::string format = python_str(input);
  std::string out;
  size_t next = 0;  // the next positional argument
  for (size_t pos = 0; pos < format.size();) {
    const size_t percent = format.find('%', pos);
    out += format.substr(pos, percent == std::string::npos ? percent : percent - pos);
    if (percent == std::string::npos) break;
    pos = percent + 1;
    if (pos < format.size() && format[pos] == '%') {
      out.push_back('%');
      ++pos;
      continue;
    }
    const Conversion c = parse_conversion(format, pos);
    const Value* arg = nullptr;
    if (c.has_name) {
      if (!mapping) template_error("format: %(name) needs keyword arguments (format requires a mapping)");
      arg = whole.find(c.name);
      if (arg == nullptr) template_error(fmt::format("format: no keyword argument '{}'", c.name));
      next = 1;  // Python: no unnamed conversion after a named one
    } else if (mapping) {
      if (next++ > 0) template_error("format: not enough arguments for format string");
      arg = &whole;
    } else {
      if (next >= a.positional.size()) template_error("format: not enough arguments for format string");
      arg = &a.positional[next++];
    }
    out += convert(c, *arg, input.is_markup);
  }
  if (!mapping && next < a.positional.size())
    template_error("format: not all arguments converted during string formatting");
  return Value::from(std::move(out));
}

// truncate(length, killwords, end, leeway): past length + leeway code points,
// cut to leave room for `end`, at the last space unless killwords.
Value truncate_filter(const Value& input, const CallArgs& a) {
  if (!input.is_string()) template_error(fmt::format("truncate needs a string, got {}", kind_name(input.kind)));
  const Value length_arg = arg_or(a, 0, "length", Value::from(int64_t{255}));
  const Value leeway_arg = arg_or(a, 3, "leeway", Value::none());
  const Value end = arg_or(a, 2, "end", Value::from("..."));
  if (length_arg.kind != Kind::kInt || !(leeway_arg.kind == Kind::kInt || leeway_arg.kind == Kind::kNone) ||
      !end.is_string())
    template_error("truncate: length and leeway must be integers and end a string");
  const int64_t length = length_arg.integer, leeway = leeway_arg.kind == Kind::kInt ? leeway_arg.integer : 5;
  const std::u32string text = code_points(input.string);
  const auto end_size = static_cast<int64_t>(code_points(end.string).size());
  if (length < end_size) template_error(fmt::format("truncate: length {} is shorter than the end", length));
  if (leeway < 0) template_error("truncate: a negative leeway");
  if (static_cast<int64_t>(text.size()) <= length || static_cast<int64_t>(text.size()) - length <= leeway) return input;
  std::u32string cut = text.substr(0, static_cast<size_t>(length - end_size));
  if (!arg_or(a, 1, "killwords", Value::from(false)).truthy()) {
    const size_t space = cut.rfind(U' ');
    if (space != std::u32string::npos) cut.resize(space);
  }
  return Value::from(utf8(cut) + (input.is_markup ? html_escape(end.string) : end.string));
}

// Python's str.center(width).
std::string center(const std::string& s, int64_t width) {
  const auto size = static_cast<int64_t>(code_points(s).size());
  if (width <= size) return s;
  if (width > kMaxFormatWidth) template_error(fmt::format("center: a width past {} is not supported", kMaxFormatWidth));
  const int64_t margin = width - size, left = margin / 2 + (margin & width & 1);
  return std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(margin - left), ' ');
}

// Python's re \w: letters, numbers, underscore.
bool word_character(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default: return c == U'_';
  }
}

int64_t word_count(const std::string& s) {
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : code_points(s)) {
    const bool w = word_character(c);
    words += w && !in_word;
    in_word = w;
  }
  return words;
}

// markupsafe's striptags: comments, then tags, removed; whitespace runs made one
// space; entities (which it would unescape) refused.
std::string strip_tags(std::string s) {
  for (const auto& [open, close] : {std::pair<const char*, const char*>{"<!--", "-->"}, {"<", ">"}}) {
    for (size_t start; (start = s.find(open)) != std::string::npos;) {
      const size_t end = s.find(close, start);
      if (end == std::string::npos) break;
      s.erase(start, end + std::string_view(close).size() - start);
    }
  }
  std::u32string out;
  for (char32_t c : code_points(s)) {
    if (!python_isspace(c)) out.push_back(c);
    else if (!out.empty() && out.back() != U' ') out.push_back(U' ');
  }
  if (!out.empty() && out.back() == U' ') out.pop_back();
  if (out.find(U'&') != std::u32string::npos) template_error("striptags: HTML entities ('&') are not supported");
  return utf8(out);
}

}  // namespace

std::optional<Value> text_format_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "format") return format_filter(input, a);
  if (name == "truncate") return truncate_filter(input, a);
  if (name == "center") {
    const Value width = arg_or(a, 0, "width", Value::from(int64_t{80}));
    if (width.kind != Kind::kInt) template_error("center: width must be an integer");
    return Value::from(center(python_str(input), width.integer));
  }
  if (name == "wordcount") return Value::from(word_count(python_str(input)));
  if (name == "striptags") return Value::from(strip_tags(python_str(input)));
  if (name == "escape" || name == "e") return input.is_markup ? input : markup(html_escape(python_str(input)));
  if (name == "forceescape") return markup(html_escape(python_str(input)));
  if (name == "attr") {  // a Python attribute: a method or a groupby tuple's field, never a dict key
    const Value* attribute = a.get(0, "name");
    if (attribute == nullptr || !attribute->is_string()) template_error("attr needs a string name");
    const Value m = method(input, attribute->string);
    if (!m.is_undefined() || !input.is_group) return m;
    const Value* field = input.find(attribute->string);
    return field != nullptr ? *field : Value::undefined(attribute->string);
  }
  return std::nullopt;
}

}  // namespace lockstep::jinja
