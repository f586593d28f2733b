// Template values with Python's str(), repr(), ==, < and json.dumps.
#include <utf8proc.h>

#include <charconv>
#include <cmath>

#include "common/error.h"
#include "tokenizer/template_internal.h"
#include "tokenizer/tok_internal.h"

namespace lockstep::jinja {

std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out.push_back(c);
  }
  return out;
}

void template_error(const std::string& what) { LS_FAIL(ErrorKind::kModel, "chat template: {}", one_line(what)); }

namespace {
[[noreturn]] void overflow(const std::string& what) { template_error("integer overflow: " + what + " is past 64 bits"); }
}  // namespace

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow(fmt::format("{} + {}", a, b));
  return r;
}

int64_t checked_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow(fmt::format("{} - {}", a, b));
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow(fmt::format("{} * {}", a, b));
  return r;
}

int64_t checked_pow(int64_t base, int64_t exponent) {
  int64_t result = 1, factor = base;
  for (int64_t e = exponent; e > 0; e >>= 1) {
    int64_t next;
    if ((e & 1) != 0 && __builtin_mul_overflow(result, factor, &result)) overflow(fmt::format("{} ** {}", base, exponent));
    if (e > 1 && __builtin_mul_overflow(factor, factor, &next)) overflow(fmt::format("{} ** {}", base, exponent));
    if (e > 1) factor = next;
  }
  return result;
}

int64_t checked_neg(int64_t a) {
  if (a == INT64_MIN) overflow(fmt::format("-({})", a));
  return -a;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow(fmt::format("{} // {}", a, b));
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

int64_t floor_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // a % -1 traps for INT64_MIN in C++; it is 0 for every a
  const int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

int64_t float_to_int(double x) {
  // Doubles in [-2^63, 2^63) convert exactly after truncation.
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0)) overflow(fmt::format("int({})", x));
  return static_cast<int64_t>(x);
}

void check_value_bytes(size_t size) {
  if (size > kMaxValueBytes) template_error(fmt::format("a value of more than {} MiB", kMaxValueBytes >> 20));
}

const Value* CallArgs::get(size_t index, const char* name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, value] : keyword)
    if (key == name) return &value;
  return nullptr;
}

Value Value::undefined(std::string name) {
  Value v;
  v.undefined_name = std::move(name);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::from(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.boolean = b;
  return v;
}
Value Value::from(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.integer = i;
  return v;
}
Value Value::from(double d) {
  Value v;
  v.kind = Kind::kFloat;
  v.number = d;
  return v;
}
Value Value::from(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.string = std::move(s);
  return v;
}
Value Value::from(List l) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<List>(std::move(l));
  return v;
}
Value Value::from(Dict d) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::from(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.function = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return boolean;
    case Kind::kInt: return integer != 0;
    case Kind::kFloat: return number != 0.0;
    case Kind::kString: return !string.empty();
    case Kind::kList: return !list->empty();
    case Kind::kDict: return !dict->empty();
    case Kind::kFunction: return true;
  }
  return false;
}

double Value::as_double() const {
  switch (kind) {
    case Kind::kBool: return boolean ? 1.0 : 0.0;
    case Kind::kInt: return static_cast<double>(integer);
    case Kind::kFloat: return number;
    default: template_error(fmt::format("expected a number, got {}", kind_name(kind)));
  }
}

const Value* Value::find(const std::string& key) const {
  if (is_group) return key == "grouper" ? &(*list)[0] : key == "list" ? &(*list)[1] : nullptr;
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict)
    if (k == key) return &v;
  return nullptr;
}

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::kUndefined: return "undefined";
    case Value::Kind::kNone: return "none";
    case Value::Kind::kBool: return "boolean";
    case Value::Kind::kInt: return "integer";
    case Value::Kind::kFloat: return "float";
    case Value::Kind::kString: return "string";
    case Value::Kind::kList: return "list";
    case Value::Kind::kDict: return "dict";
    case Value::Kind::kFunction: return "function";
  }
  return "?";
}

namespace {

// Python's repr of a float: the shortest digits that round-trip, positional
// for exponents -4..15, else scientific with a two-digit exponent at least.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::stoi(sci.substr(e + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + "." + digits.substr(static_cast<size_t>(exponent) + 1);
    }
  } else {
    out = fmt::format("{}{}{}e{}{:02d}", digits[0], digits.size() > 1 ? "." : "", digits.substr(1),
                      exponent < 0 ? '-' : '+', std::abs(exponent));
  }
  if (negative) out.insert(out.begin(), '-');
  return out;
}

namespace {

// Python's str.isprintable for one character: false for the categories
// Other (Cc, Cf, Cs, Co, Cn) and Separator (Zl, Zp, Zs) except the space.
bool python_printable(char32_t c) {
  if (c == U' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

}  // namespace

// Python's repr() of a str: the quote it picks, backslash escapes for \\, the
// quote, \n \r \t, and \xhh / \uhhhh / \Uhhhhhhhh for what is not printable.
std::string string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const char32_t quote = has_single && s.find('"') == std::string::npos ? U'"' : U'\'';
  std::string out(1, static_cast<char>(quote));
  for (char32_t c : code_points(s)) {
    if (c == U'\\' || c == quote) out += '\\', out += static_cast<char>(c);
    else if (c == U'\n') out += "\\n";
    else if (c == U'\r') out += "\\r";
    else if (c == U'\t') out += "\\t";
    else if (python_printable(c)) tok_detail::append_utf8(out, c);
    else if (c < 0x100) out += fmt::format("\\x{:02x}", static_cast<uint32_t>(c));
    else if (c < 0x10000) out += fmt::format("\\u{:04x}", static_cast<uint32_t>(c));
    else out += fmt::format("\\U{:08x}", static_cast<uint32_t>(c));
  }
  out.push_back(static_cast<char>(quote));
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) out += fmt::format("\\u{:04x}", c);
        else out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

void json_value(const Value& v, int indent, int level, std::string& out) {
  const auto newline = [&](int depth) {
    if (indent < 0) return;
    out.push_back('\n');
    check_value_bytes(out.size() + static_cast<size_t>(indent) * static_cast<size_t>(depth));
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(depth), ' ');
  };
  const char* separator = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.boolean ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.integer); return;
    case Value::Kind::kFloat:
      out += std::isnan(v.number) ? "NaN" : std::isinf(v.number) ? (v.number > 0 ? "Infinity" : "-Infinity")
                                                                    : float_repr(v.number);
      return;
    case Value::Kind::kString: json_string(v.string, out); return;
    case Value::Kind::kList:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i > 0) out += separator;
        newline(level + 1);
        json_value((*v.list)[i], indent, level + 1, out);
      }
      newline(level);
      out.push_back(']');
      return;
    case Value::Kind::kDict:
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      out.push_back('{');
      for (size_t i = 0; i < v.dict->size(); ++i) {
        if (i > 0) out += separator;
        newline(level + 1);
        json_string((*v.dict)[i].first, out);
        out += ": ";
        json_value((*v.dict)[i].second, indent, level + 1, out);
      }
      newline(level);
      out.push_back('}');
      return;
    case Value::Kind::kUndefined:
    case Value::Kind::kFunction: break;
  }
  template_error(fmt::format("tojson: a {} is not JSON serializable", kind_name(v.kind)));
}

}  // namespace

std::string python_repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kString: return v.is_markup ? "Markup(" + string_repr(v.string) + ")" : string_repr(v.string);
    case Value::Kind::kList: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i > 0 ? ", " : "") + python_repr((*v.list)[i]);
      if (v.is_tuple) return out + (v.list->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (size_t i = 0; i < v.dict->size(); ++i)
        out += (i > 0 ? ", " : "") + string_repr((*v.dict)[i].first) + ": " + python_repr((*v.dict)[i].second);
      return out + "}";
    }
    default: return python_str(v);
  }
}

std::string python_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.boolean ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.integer);
    case Value::Kind::kFloat: return float_repr(v.number);
    case Value::Kind::kString: return v.string;
    case Value::Kind::kFunction: return "<function>";
    case Value::Kind::kList:
    case Value::Kind::kDict: return python_repr(v);
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat)
      return (a.kind == Value::Kind::kBool ? a.boolean : a.integer) ==
             (b.kind == Value::Kind::kBool ? b.boolean : b.integer);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind || a.is_tuple != b.is_tuple) return false;  // Python: (1, 2) != [1, 2]
  switch (a.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.string == b.string;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = b.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    case Value::Kind::kFunction: return a.function == b.function;
    default: return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.string < b.string;  // UTF-8 bytes order as code points
  if (a.kind == Value::Kind::kList && b.kind == Value::Kind::kList && a.is_tuple == b.is_tuple) {
    // Python: the first items that differ decide (equal ones are never ordered), else the shorter.
    for (size_t i = 0; i < a.list->size() && i < b.list->size(); ++i)
      if (!equal((*a.list)[i], (*b.list)[i])) return less((*a.list)[i], (*b.list)[i]);
    return a.list->size() < b.list->size();
  }
  template_error(fmt::format("cannot order a {} and a {}", kind_name(a.kind), kind_name(b.kind)));
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_value(v, indent, 0, out);
  return out;
}

std::u32string code_points(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) out.push_back(tok_detail::next_code_point(s, i));
  return out;
}

std::string utf8(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) tok_detail::append_utf8(out, c);
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '\'': out += "&#39;"; break;
      case '"': out += "&#34;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

bool python_isspace(char32_t c) { return tok_detail::is_white_space(c) || (c >= 0x1c && c <= 0x1f); }

}  // namespace lockstep::jinja
