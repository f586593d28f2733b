// Internal pieces of the chat-template renderer (chat_template.h): a subset
// of Jinja2 as Hugging Face transformers configures it for chat templates
// (trim_blocks, lstrip_blocks, loop controls, its own tojson). Values follow
// Python's semantics where templates can see them (str(), truthiness,
// comparisons, slicing); what the subset lacks is refused by name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::jinja {

struct Value;
using List = std::vector<Value>;
// Insertion-ordered, as Python dicts are.
using Dict = std::vector<std::pair<std::string, Value>>;

// Arguments of a call: positional, then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`; nullptr when absent.
  const Value* get(size_t index, const char* name) const;
};
using Function = std::function<Value(const CallArgs&)>;

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  Kind kind = Kind::kUndefined;
  bool boolean = false;
  int64_t integer = 0;
  double number = 0.0;
  std::string string;
  std::shared_ptr<List> list;  // shared: a template sees one list however it is reached
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> function;
  bool is_namespace = false;  // a namespace() object: the one dict `set x.attr` may change
  bool is_tuple = false;      // a list written (a, b): shown as Python shows a tuple
  bool is_group = false;      // groupby's (grouper, list) tuple: its items are also .grouper and .list
  bool is_markup = false;     // a string from escape or safe: markupsafe's Markup, which escapes what joins it
  std::string undefined_name;  // what an undefined value was looked up as (for errors)

  static Value undefined(std::string name = "");
  static Value none();
  static Value from(bool b);
  static Value from(int64_t i);
  static Value from(double d);
  static Value from(std::string s);
  static Value from(const char* s) { return from(std::string(s)); }
  static Value from(List l);
  static Value from(Dict d);
  static Value from(Function f);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  bool truthy() const;
  double as_double() const;
  // The dict entry `key` (or a groupby tuple's "grouper" / "list"), or nullptr.
  const Value* find(const std::string& key) const;
};

const char* kind_name(Value::Kind kind);  // "string", "list", ... for errors
std::string python_str(const Value& v);   // str(v)
std::string python_repr(const Value& v);  // repr(v), as str() shows list items
bool equal(const Value& a, const Value& b);
// a < b where Python allows it (numbers, strings, lists); throws otherwise.
bool less(const Value& a, const Value& b);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none, as transformers' tojson).
std::string to_json(const Value& v, int indent);
// A string's code points, and back.
std::u32string code_points(const std::string& s);
std::string utf8(const std::u32string& s);
bool python_isspace(char32_t c);
// markupsafe's escape: & < > ' " as HTML entities.
std::string html_escape(const std::string& s);

// Throws kModel "chat template: <what>" (a template the subset cannot render
// or that is wrong), control characters in `what` escaped to keep one line.
[[noreturn]] void template_error(const std::string& what);

// The most a template may build: strings of kMaxValueBytes, lists of
// kMaxListItems (a list item costs far more than a byte). Builders check
// before they grow a value, so a runaway template fails before it has
// taken the memory.
inline constexpr size_t kMaxValueBytes = size_t{64} << 20;
inline constexpr size_t kMaxListItems = size_t{1} << 20;
// Fails when a string is about to be made `size` bytes long, past kMaxValueBytes.
void check_value_bytes(size_t size);
std::string one_line(const std::string& text);  // "\n" for a newline, "\x01" for other controls

// Python's integers have no bound, ours 64 bits: a result past them stops
// the template ("integer overflow: <what>") rather than wrapping around.
int64_t checked_add(int64_t a, int64_t b);
int64_t checked_sub(int64_t a, int64_t b);
int64_t checked_mul(int64_t a, int64_t b);
int64_t checked_pow(int64_t base, int64_t exponent);  // exponent >= 0, by squaring: exact
int64_t checked_neg(int64_t a);
int64_t floor_div(int64_t a, int64_t b);  // Python's //, b != 0
int64_t floor_mod(int64_t a, int64_t b);  // Python's %, b != 0
// int(x) of a float: truncated; past 64 bits (or infinite) stops the template.
int64_t float_to_int(double x);

// One level of nesting (an expression, a block, a macro call) for its
// lifetime: past `limit` levels it fails with "<what> (<limit>)" instead of
// letting the recursion run out of stack.
class NestingGuard {
 public:
  NestingGuard(int& depth, int limit, const std::string& what) : depth_(depth) {
    if (++depth_ > limit) {
      --depth_;
      template_error(what + " (more than " + std::to_string(limit) + " levels)");
    }
  }
  ~NestingGuard() { --depth_; }
  NestingGuard(const NestingGuard&) = delete;
  NestingGuard& operator=(const NestingGuard&) = delete;

 private:
  int& depth_;
};

// ---- Syntax ----------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Expr {
  enum class Kind {
    kLiteral, kName, kList, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary,
    kAnd, kOr, kNot, kCondition
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  std::vector<ExprPtr> args;  // operands / positional arguments; kDict: key, value, key, value...
  std::vector<std::pair<std::string, ExprPtr>> keyword_args;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kMacro, kPlain, kFilterBlock, kCallBlock };
  Kind kind;
  int line = 0;
  std::string text;                  // kText
  // kOutput: 1; kIf: conditions; kFor: iterable, filter?; kSet: value; kCallBlock: the call;
  // kFilterBlock: its filters as a chain of kFilter whose innermost operand is an undefined literal
  std::vector<ExprPtr> exprs;
  std::vector<Body> bodies;          // kIf: one per condition (+ else); kFor: body (+ else); others: body
  std::vector<std::string> targets;  // kFor / kSet / kSetBlock: names; kSet "ns.attr" as {"ns", "attr"} with attr set
  std::string attribute;             // kSet on a namespace attribute
  bool has_else = false;             // kIf / kFor
  bool has_filter = false;           // kFor: `for x in xs if cond`
  std::string macro_name;            // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro / kCallBlock (caller's): name and default (or null)
};

// Parses template source (whitespace control as transformers sets it up).
Body parse_template(const std::string& source);

// ---- Evaluation ------------------------------------------------------------

// Renders `body` with `globals` as the outermost scope.
std::string render(const Body& body, const std::map<std::string, Value>& globals);

// Filters, tests and methods by name (template_builtins.cpp); each throws
// template_error naming what it does not support.
Value apply_filter(const std::string& name, const Value& input, const CallArgs& args);
bool apply_test(const std::string& name, const Value& input, const CallArgs& args);
// Jinja's getitem, one step: a dict's (or a groupby tuple's) key, a list's or
// string's index (negative from the end); undefined where there is none.
Value subscript(const Value& obj, const Value& key);
// A bound method (`"a b".split`, `d.items`), or undefined when `v` has none named `name`.
Value method(const Value& v, const std::string& name);

// Shared by the filters of template_builtins.cpp and template_filters.cpp.
std::string map_case(const std::string& s, int mode);  // Python's str.lower / upper / capitalize / title: 0..3
List as_list(const Value& v);                         // what iterating `v` gives (a dict's keys, a string's characters)
// Jinja's attribute lookup for filters: "a.b" goes down dicts, an all-digit part (or an integer) indexes a
// list; `fallback` replaces an undefined part; a part of an undefined one fails.
Value attribute_of(const Value& item, const Value& attribute, const Value* fallback = nullptr);
Value arg_or(const CallArgs& a, size_t i, const char* name, const Value& fallback);
// The filters of template_filters.cpp (sort, dictsort, min, max, unique, groupby, sum, batch, slice, round)
// and of template_text_filters.cpp (format, truncate, center, wordcount, striptags, escape, attr); nullopt
// for other names.
std::optional<Value> collection_filter(const std::string& name, const Value& input, const CallArgs& args);
std::optional<Value> text_format_filter(const std::string& name, const Value& input, const CallArgs& args);

}  // namespace lockstep::jinja
