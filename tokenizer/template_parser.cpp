// Chat-template source to syntax tree. Whitespace control is Jinja2's with
// transformers' settings: trim_blocks (a newline right after a block or
// comment tag is dropped), lstrip_blocks (spaces and tabs before a block or
// comment tag at the start of a line are dropped), "-" and "+" modifiers,
// and one trailing newline of the source dropped (keep_trailing_newline off).
#include <cstring>

#include "common/error.h"
#include "tokenizer/template_internal.h"

namespace lockstep::jinja {

namespace {

constexpr int kMaxNesting = 256;  // expressions, and blocks inside blocks

// ---- Tags ------------------------------------------------------------------

struct Segment {
  enum class Kind { kText, kVariable, kBlock };
  Kind kind;
  std::string content;  // text, or the source inside the tag
  int line;
};

int count_lines(const std::string& s, size_t begin, size_t end) {
  int n = 0;
  for (size_t i = begin; i < end && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Where the tag opened at `open` ends: the index of its closing "}}", "%}"
// or "#}" (a "-" or "+" before it belongs to the tag), skipping strings and
// nested brackets in expressions.
size_t find_tag_end(const std::string& s, size_t open, char kind, int line) {
  const char close = kind == '{' ? '}' : kind;
  if (kind == '#') {
    const size_t end = s.find("#}", open + 2);
    if (end == std::string::npos) template_error(fmt::format("comment opened on line {} is not closed", line));
    return end;
  }
  int depth = 0;
  for (size_t i = open + 2; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '"' || c == '\'') {
      for (++i; i < s.size() && s[i] != c; ++i)
        if (s[i] == '\\') ++i;
      continue;
    }
    if (c == '(' || c == '[' || c == '{') ++depth;
    if (depth > 0 && (c == ')' || c == ']' || c == '}')) {
      --depth;
      continue;
    }
    if (depth == 0 && c == close && i + 1 < s.size() && s[i + 1] == '}') return i;
  }
  template_error(fmt::format("tag opened on line {} is not closed", line));
}

std::vector<Segment> split_tags(std::string source) {
  // Newlines as Jinja normalizes them, then the one trailing newline dropped.
  std::string s;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(source[i]);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();

  std::vector<Segment> out;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the last tag ended with a newline (or nothing came yet)
  while (pos <= s.size()) {
    size_t open = pos;
    while ((open = s.find('{', open)) != std::string::npos &&
           (open + 1 >= s.size() || std::strchr("{%#", s[open + 1]) == nullptr))
      ++open;
    std::string text = s.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Segment::Kind::kText, text, line});
      break;
    }
    const char kind = s[open + 1];
    const char sign = open + 2 < s.size() ? s[open + 2] : '\0';
    if (sign == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (sign != '+' && kind != '{') {
      const size_t line_begin = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      bool blank = line_begin < text.size();
      for (size_t i = line_begin; i < text.size(); ++i) blank = blank && is_space(text[i]);
      if (blank && (line_begin > 0 || line_starting)) text.resize(line_begin);
    }
    const int tag_line = line + count_lines(s, pos, open);
    if (!text.empty()) out.push_back({Segment::Kind::kText, text, line});
    const size_t close = find_tag_end(s, open, kind, tag_line);
    size_t inner_begin = open + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    size_t inner_end = close;
    const char end_sign = close > inner_begin && (s[close - 1] == '-' || s[close - 1] == '+') ? s[close - 1] : '\0';
    if (end_sign != '\0') --inner_end;
    if (kind != '#')
      out.push_back({kind == '{' ? Segment::Kind::kVariable : Segment::Kind::kBlock,
                     s.substr(inner_begin, inner_end - inner_begin), tag_line});
    size_t next = close + 2;
    if (end_sign == '-') {
      while (next < s.size() && is_space(s[next])) ++next;
    } else if (end_sign != '+' && kind != '{' && next < s.size() && s[next] == '\n') {
      ++next;  // trim_blocks
    }
    line += count_lines(s, pos, next);
    line_starting = next > 0 && s[next - 1] == '\n';
    pos = next;
  }
  return out;
}

// ---- Expression tokens -------------------------------------------------------

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind;
  std::string text;  // name, operator, or the string's value
  int64_t integer = 0;
  double number = 0.0;
};

void append_escape(const std::string& s, size_t& i, std::string& out) {
  const char c = s[++i];
  switch (c) {
    case 'n': out.push_back('\n'); break;
    case 't': out.push_back('\t'); break;
    case 'r': out.push_back('\r'); break;
    case '0': out.push_back('\0'); break;
    case '\\': case '\'': case '"': out.push_back(c); break;
    case 'u': case 'x': {
      const size_t digits = c == 'u' ? 4 : 2;
      char32_t cp = 0;
      for (size_t k = 1; k <= digits; ++k) {
        const char h = i + k < s.size() ? s[i + k] : '\0';
        const int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                      : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (v < 0) template_error(fmt::format("bad \\{} escape in a string", c));
        cp = cp * 16 + static_cast<char32_t>(v);
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) template_error("a surrogate \\u escape in a string");
      out += utf8(std::u32string(1, cp));
      i += digits;
      break;
    }
    default: out.push_back('\\'); out.push_back(c);  // Python keeps unknown escapes
  }
}

std::vector<Token> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  static const char* const kOps[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "(", ")", "[", "]", "{", "}", ".", ",", ":", "|", "="};
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::Kind::kName, s.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        for (++j; j < s.size() && std::isdigit(static_cast<unsigned char>(s[j])); ++j) {}
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        is_float = true;
        ++j;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      std::string digits;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') digits.push_back(s[k]);
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits};
      try {
        if (is_float) t.number = std::stod(digits);
        else t.integer = std::stoll(digits);
      } catch (const std::exception&) {  // past int64 or double
        template_error(fmt::format("number {} out of range on line {}", digits, line));
      }
      out.push_back(t);
      i = j;
    } else if (c == '"' || c == '\'') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) append_escape(s, j, value);
        else value.push_back(s[j]);
      }
      if (j >= s.size()) template_error(fmt::format("unterminated string on line {}", line));
      out.push_back({Token::Kind::kString, value});
      i = j + 1;
    } else {
      const char* op = nullptr;
      for (const char* candidate : kOps)
        if (s.compare(i, std::strlen(candidate), candidate) == 0) {
          op = candidate;
          break;
        }
      if (op == nullptr) template_error(fmt::format("unexpected character '{}' on line {}", c, line));
      out.push_back({Token::Kind::kOp, op});
      i += std::strlen(op);
    }
  }
  out.push_back({Token::Kind::kEnd, ""});
  return out;
}

// ---- Expressions -------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(const std::string& source, int line) : tokens_(tokenize(source, line)), line_(line) {}

  bool at_end() const { return peek().kind == Token::Kind::kEnd; }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Token::Kind::kName && peek(ahead).text == name;
  }
  bool skip_op(const char* op) { return is_op(op) && (++pos_, true); }
  bool skip_name(const char* name) { return is_name(name) && (++pos_, true); }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(fmt::format("expected '{}'", op));
  }
  std::string expect_name() {
    if (peek().kind != Token::Kind::kName) fail("expected a name");
    return tokens_[pos_++].text;
  }
  void expect_end() {
    if (!at_end()) fail(fmt::format("unexpected '{}'", peek().text));
  }
  [[noreturn]] void fail(const std::string& what) const {
    template_error(fmt::format("{} on line {}", what, line_));
  }

  // A full expression, with `a if b else c`.
  ExprPtr expression() {
    ExprPtr e = or_expr();
    while (skip_name("if")) {
      ExprPtr condition = or_expr();
      ExprPtr otherwise = skip_name("else") ? expression() : literal(Value::undefined());
      e = node(Expr::Kind::kCondition, "", std::move(condition), std::move(e), std::move(otherwise));
    }
    return e;
  }
  // `name(args) | name(args)...` of a filter block, applied to an undefined placeholder.
  ExprPtr filter_chain() {
    ExprPtr e = literal(Value::undefined());
    do {
      auto f = node(Expr::Kind::kFilter, expect_name(), std::move(e));
      if (is_op("(")) call_arguments(*f);
      e = std::move(f);
    } while (skip_op("|"));
    return e;
  }
  // `(name, name=default, ...)` of a macro or a call block.
  std::vector<std::pair<std::string, ExprPtr>> parameters() {
    std::vector<std::pair<std::string, ExprPtr>> params;
    expect_op("(");
    while (!skip_op(")")) {
      std::string name = expect_name();
      ExprPtr fallback = skip_op("=") ? expression() : nullptr;
      params.emplace_back(std::move(name), std::move(fallback));
      if (!skip_op(",")) {
        expect_op(")");
        break;
      }
    }
    return params;
  }
  // `a, b` without brackets (for targets of set and values of set) is a list.
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    auto list = node(Expr::Kind::kList, "tuple");
    list->args.push_back(std::move(first));
    while (skip_op(",") && !at_end() && !is_op(")")) list->args.push_back(expression());  // (a,) is a tuple too
    return list;
  }

 private:
  ExprPtr literal(Value v) {
    auto e = std::make_unique<Expr>();
    e->kind = Expr::Kind::kLiteral;
    e->line = line_;
    e->literal = std::move(v);
    return e;
  }
  template <typename... Operands>
  ExprPtr node(Expr::Kind kind, std::string name, Operands&&... operands) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    e->name = std::move(name);
    (e->args.push_back(std::forward<Operands>(operands)), ...);
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (skip_name("or")) e = node(Expr::Kind::kOr, "", std::move(e), and_expr());
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (skip_name("and")) e = node(Expr::Kind::kAnd, "", std::move(e), not_expr());
    return e;
  }
  ExprPtr not_expr() {
    NestingGuard guard(depth_, kMaxNesting, fmt::format("expression nested too deeply on line {}", line_));
    if (skip_name("not")) return node(Expr::Kind::kNot, "", not_expr());
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = additive();
    for (;;) {
      std::string op;
      for (const char* candidate : {"==", "!=", "<", ">", "<=", ">="})
        if (is_op(candidate)) op = candidate;
      if (!op.empty()) {
        ++pos_;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        pos_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = node(Expr::Kind::kBinary, op, std::move(e), additive());
      // Python reads a < b < c as a < b and b < c; refused rather than read as (a < b) < c.
      for (const char* next : {"==", "!=", "<", ">", "<=", ">="})
        if (is_op(next) || is_name("in") || (is_name("not") && is_name("in", 1)))
          fail(fmt::format("chained comparison ('{}' after '{}') is not supported: use 'and'", peek().text, op));
    }
  }
  ExprPtr additive() {
    ExprPtr e = concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = tokens_[pos_++].text;
      e = node(Expr::Kind::kBinary, op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = multiplicative();
    while (skip_op("~")) e = node(Expr::Kind::kBinary, "~", std::move(e), multiplicative());
    return e;
  }
  ExprPtr multiplicative() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = tokens_[pos_++].text;
      e = node(Expr::Kind::kBinary, op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (skip_op("**")) e = node(Expr::Kind::kBinary, "**", std::move(e), unary(true));
    return e;
  }
  ExprPtr unary(bool with_filter) {
    NestingGuard guard(depth_, kMaxNesting, fmt::format("expression nested too deeply on line {}", line_));
    ExprPtr e;
    if (skip_op("-")) e = node(Expr::Kind::kUnary, "-", unary(false));
    else if (skip_op("+")) e = node(Expr::Kind::kUnary, "+", unary(false));
    else e = primary();
    e = postfix(std::move(e));
    return with_filter ? filters_and_tests(std::move(e)) : std::move(e);
  }

  ExprPtr primary();
  ExprPtr postfix(ExprPtr e);
  ExprPtr filters_and_tests(ExprPtr e);
  void call_arguments(Expr& call);

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

ExprPtr ExprParser::primary() {
  const Token t = peek();
  ++pos_;
  switch (t.kind) {
    case Token::Kind::kName:
      if (t.text == "true" || t.text == "True") return literal(Value::from(true));
      if (t.text == "false" || t.text == "False") return literal(Value::from(false));
      if (t.text == "none" || t.text == "None") return literal(Value::none());
      return node(Expr::Kind::kName, t.text);
    case Token::Kind::kString: {
      std::string s = t.text;
      while (peek().kind == Token::Kind::kString) s += tokens_[pos_++].text;  // adjacent literals join
      return literal(Value::from(s));
    }
    case Token::Kind::kInt: return literal(Value::from(t.integer));
    case Token::Kind::kFloat: return literal(Value::from(t.number));
    case Token::Kind::kEnd: fail("expression ends early");
    case Token::Kind::kOp: break;
  }
  if (t.text == "(") {
    if (skip_op(")")) return node(Expr::Kind::kList, "tuple");
    ExprPtr e = tuple_or_expression();
    expect_op(")");
    return e;
  }
  if (t.text == "[") {
    auto list = node(Expr::Kind::kList, "");
    while (!skip_op("]")) {
      list->args.push_back(expression());
      if (!skip_op(",")) {
        expect_op("]");
        break;
      }
    }
    return list;
  }
  if (t.text == "{") {
    auto dict = node(Expr::Kind::kDict, "");
    while (!skip_op("}")) {
      dict->args.push_back(expression());
      expect_op(":");
      dict->args.push_back(expression());
      if (!skip_op(",")) {
        expect_op("}");
        break;
      }
    }
    return dict;
  }
  fail(fmt::format("unexpected '{}'", t.text));
}

ExprPtr ExprParser::postfix(ExprPtr e) {
  for (;;) {
    if (skip_op(".")) {
      if (peek().kind == Token::Kind::kInt) {
        e = node(Expr::Kind::kItem, "", std::move(e), literal(Value::from(tokens_[pos_++].integer)));
      } else {
        e = node(Expr::Kind::kAttr, expect_name(), std::move(e));
      }
    } else if (skip_op("[")) {
      ExprPtr parts[3];
      bool slice = false;
      for (int k = 0; k < 3; ++k) {
        if (!is_op(":") && !is_op("]")) parts[k] = expression();
        if (k < 2 && skip_op(":")) slice = true;
        else break;
      }
      expect_op("]");
      if (!slice) {
        if (!parts[0]) fail("empty subscript");
        e = node(Expr::Kind::kItem, "", std::move(e), std::move(parts[0]));
      } else {
        auto s = node(Expr::Kind::kSlice, "", std::move(e));
        for (auto& p : parts) s->args.push_back(p ? std::move(p) : literal(Value::none()));
        e = std::move(s);
      }
    } else if (is_op("(")) {
      auto call = node(Expr::Kind::kCall, "", std::move(e));
      call_arguments(*call);
      e = std::move(call);
    } else {
      return e;
    }
  }
}

void ExprParser::call_arguments(Expr& call) {
  expect_op("(");
  while (!skip_op(")")) {
    if (peek().kind == Token::Kind::kName && is_op("=", 1)) {
      std::string key = expect_name();
      ++pos_;
      call.keyword_args.emplace_back(std::move(key), expression());
    } else {
      if (!call.keyword_args.empty()) fail("a positional argument after a keyword argument");
      call.args.push_back(expression());
    }
    if (!skip_op(",")) {
      expect_op(")");
      break;
    }
  }
}

ExprPtr ExprParser::filters_and_tests(ExprPtr e) {
  for (;;) {
    if (skip_op("|")) {
      auto f = node(Expr::Kind::kFilter, expect_name(), std::move(e));
      if (is_op("(")) call_arguments(*f);
      e = std::move(f);
    } else if (skip_name("is")) {
      const bool negated = skip_name("not");
      auto t = node(Expr::Kind::kTest, expect_name(), std::move(e));
      if (is_op("(")) {
        call_arguments(*t);
      } else {
        const Token& next = peek();
        const bool argument =
            next.kind == Token::Kind::kString || next.kind == Token::Kind::kInt || next.kind == Token::Kind::kFloat ||
            (next.kind == Token::Kind::kName && next.text != "else" && next.text != "or" && next.text != "and" &&
             next.text != "if" && next.text != "is" && next.text != "in" && next.text != "not");
        if (argument) t->args.push_back(postfix(primary()));
      }
      e = negated ? node(Expr::Kind::kNot, "", std::move(t)) : std::move(t);
    } else {
      return e;
    }
  }
}

// ---- Statements ----------------------------------------------------------------

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  // Statements up to one of `ends` (a block tag whose first word is in it),
  // whose parser is left in end_parser_ for the caller.
  Body parse_body(const std::vector<std::string>& ends, std::string& end_found);
  std::unique_ptr<Node> parse_statement(const std::string& keyword, ExprParser& p, int line);
  std::unique_ptr<Node> parse_if(ExprParser& p, int line);
  std::unique_ptr<Node> parse_for(ExprParser& p, int line);
  std::unique_ptr<Node> parse_set(ExprParser& p, int line);
  std::unique_ptr<Node> parse_macro(ExprParser& p, int line);
  std::unique_ptr<Node> parse_filter_or_call(const std::string& keyword, ExprParser& p, int line);

  std::vector<Segment> segments_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::unique_ptr<ExprParser> end_parser_;
};

std::unique_ptr<Node> make_node(Node::Kind kind, int line) {
  auto n = std::make_unique<Node>();
  n->kind = kind;
  n->line = line;
  return n;
}

Body TemplateParser::parse_body(const std::vector<std::string>& ends, std::string& end_found) {
  NestingGuard guard(depth_, kMaxNesting, "blocks nested too deeply");
  Body body;
  while (pos_ < segments_.size()) {
    const Segment& seg = segments_[pos_++];
    if (seg.kind == Segment::Kind::kText) {
      auto n = make_node(Node::Kind::kText, seg.line);
      n->text = seg.content;
      body.push_back(std::move(n));
      continue;
    }
    auto p = std::make_unique<ExprParser>(seg.content, seg.line);
    if (seg.kind == Segment::Kind::kVariable) {
      auto n = make_node(Node::Kind::kOutput, seg.line);
      n->exprs.push_back(p->expression());
      p->expect_end();
      body.push_back(std::move(n));
      continue;
    }
    const std::string keyword = p->expect_name();
    for (const std::string& end : ends) {
      if (keyword == end) {
        end_found = keyword;
        end_parser_ = std::move(p);
        return body;
      }
    }
    body.push_back(parse_statement(keyword, *p, seg.line));
  }
  if (!ends.empty()) template_error(fmt::format("missing '{{% {} %}}' at the end of the template", ends.back()));
  return body;
}

std::unique_ptr<Node> TemplateParser::parse_statement(const std::string& keyword, ExprParser& p, int line) {
  if (keyword == "if") return parse_if(p, line);
  if (keyword == "for") return parse_for(p, line);
  if (keyword == "set") return parse_set(p, line);
  if (keyword == "macro") return parse_macro(p, line);
  if (keyword == "break" || keyword == "continue") {
    p.expect_end();
    return make_node(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line);
  }
  if (keyword == "filter" || keyword == "call") return parse_filter_or_call(keyword, p, line);
  if (keyword == "generation") {  // transformers' marker of assistant text: renders its body
    p.expect_end();
    auto n = make_node(Node::Kind::kPlain, line);
    std::string end;
    n->bodies.push_back(parse_body({"endgeneration"}, end));
    end_parser_->expect_end();
    return n;
  }
  template_error(fmt::format("unsupported tag '{}' on line {}", keyword, line));
}

std::unique_ptr<Node> TemplateParser::parse_if(ExprParser& p, int line) {
  auto n = make_node(Node::Kind::kIf, line);
  n->exprs.push_back(p.expression());
  p.expect_end();
  for (;;) {
    std::string end;
    n->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
    ExprParser& q = *end_parser_;
    if (end == "elif") {
      n->exprs.push_back(q.expression());
      q.expect_end();
      continue;
    }
    q.expect_end();
    if (end == "else") {
      n->has_else = true;
      n->bodies.push_back(parse_body({"endif"}, end));
      end_parser_->expect_end();
    }
    return n;
  }
}

std::unique_ptr<Node> TemplateParser::parse_for(ExprParser& p, int line) {
  auto n = make_node(Node::Kind::kFor, line);
  const bool parenthesized = p.skip_op("(");
  do n->targets.push_back(p.expect_name());
  while (p.skip_op(","));
  if (parenthesized) p.expect_op(")");
  if (!p.skip_name("in")) p.fail("expected 'in' in a for loop");
  n->exprs.push_back(p.expression());
  // `expression()` took a trailing `if` as a conditional: a filter is `for x in xs if cond`.
  if (n->exprs[0]->kind == Expr::Kind::kCondition && n->exprs[0]->args[2]->kind == Expr::Kind::kLiteral &&
      n->exprs[0]->args[2]->literal.is_undefined()) {
    ExprPtr cond = std::move(n->exprs[0]);
    n->exprs[0] = std::move(cond->args[1]);
    n->exprs.push_back(std::move(cond->args[0]));
    n->has_filter = true;
  }
  if (p.skip_name("recursive")) p.fail("recursive loops are not supported");
  p.expect_end();
  std::string end;
  n->bodies.push_back(parse_body({"else", "endfor"}, end));
  end_parser_->expect_end();
  if (end == "else") {
    n->has_else = true;
    n->bodies.push_back(parse_body({"endfor"}, end));
    end_parser_->expect_end();
  }
  return n;
}

std::unique_ptr<Node> TemplateParser::parse_set(ExprParser& p, int line) {
  std::vector<std::string> targets{p.expect_name()};
  std::string attribute;
  if (p.skip_op(".")) attribute = p.expect_name();
  while (attribute.empty() && p.skip_op(",")) targets.push_back(p.expect_name());
  if (p.at_end() && targets.size() == 1 && attribute.empty()) {  // {% set x %}...{% endset %}
    auto n = make_node(Node::Kind::kSetBlock, line);
    n->targets = targets;
    std::string end;
    n->bodies.push_back(parse_body({"endset"}, end));
    end_parser_->expect_end();
    return n;
  }
  p.expect_op("=");
  auto n = make_node(Node::Kind::kSet, line);
  n->targets = std::move(targets);
  n->attribute = std::move(attribute);
  n->exprs.push_back(p.tuple_or_expression());
  p.expect_end();
  return n;
}

std::unique_ptr<Node> TemplateParser::parse_macro(ExprParser& p, int line) {
  auto n = make_node(Node::Kind::kMacro, line);
  n->macro_name = p.expect_name();
  n->params = p.parameters();
  p.expect_end();
  std::string end;
  n->bodies.push_back(parse_body({"endmacro"}, end));
  end_parser_->expect_end();
  return n;
}

// {% filter name(args) | ... %}body{% endfilter %}, {% call(params) macro(args) %}body{% endcall %}.
std::unique_ptr<Node> TemplateParser::parse_filter_or_call(const std::string& keyword, ExprParser& p, int line) {
  auto n = make_node(keyword == "filter" ? Node::Kind::kFilterBlock : Node::Kind::kCallBlock, line);
  if (keyword == "filter") {
    n->exprs.push_back(p.filter_chain());
  } else {
    if (p.is_op("(")) n->params = p.parameters();
    n->exprs.push_back(p.expression());
    if (n->exprs[0]->kind != Expr::Kind::kCall) p.fail("a call block needs a call");
  }
  p.expect_end();
  std::string end;
  n->bodies.push_back(parse_body({"end" + keyword}, end));
  end_parser_->expect_end();
  return n;
}

}  // namespace

Body parse_template(const std::string& source) { return TemplateParser(split_tags(source)).parse(); }

}  // namespace lockstep::jinja
