// Rendering a parsed chat template: Jinja2's scoping (a loop's assignments
// stay in the loop; namespace() objects carry values out), Python's
// operators, loop controls and macros.
#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "tokenizer/template_internal.h"

namespace lockstep::jinja {

namespace {

// What one rendering may do before it is stopped: a template that would run
// away (a macro calling itself, loops over loops, a string multiplied into
// gigabytes) fails with an error instead of exhausting the stack, memory or time.
constexpr int kMaxMacroDepth = 64;
constexpr int64_t kMaxLoopIterations = 1'000'000;
constexpr size_t kMaxOutputBytes = kMaxValueBytes;

// A string about to be made `size` bytes long.
void check_size(size_t size, int line) {
  if (size > kMaxOutputBytes)
    template_error(fmt::format("a value of more than {} MiB (line {})", kMaxOutputBytes >> 20, line));
}

// A list about to be made `items` long.
void check_items(size_t items, int line) {
  if (items > kMaxListItems) template_error(fmt::format("a list of more than {} items (line {})", kMaxListItems, line));
}

class Scope {
 public:
  explicit Scope(Scope* parent) : parent_(parent) {}
  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent_) {
      auto it = s->vars_.find(name);
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }

 private:
  std::map<std::string, Value> vars_;
  Scope* parent_;
};

enum class Flow { kNormal, kBreak, kContinue };

// An undefined value used where a value is needed. Its name is what it was
// looked up as, or (holding a space) the whole reason, e.g. "a none has no attribute 'strip'".
[[noreturn]] void undefined_error(const Value& v, int line) {
  const std::string& name = v.undefined_name;
  if (name.find(' ') != std::string::npos) template_error(fmt::format("{} (line {})", name, line));
  template_error(fmt::format("'{}' is undefined (line {})", name.empty() ? "value" : name, line));
}

// Python's index into a sequence of `size` (negative from the end); -1 when outside.
int64_t sequence_index(int64_t i, int64_t size) {
  if (i < 0) i += size;
  return i >= 0 && i < size ? i : -1;
}

}  // namespace

Value subscript(const Value& obj, const Value& key) {
  if (key.is_string()) {
    const Value* v = obj.find(key.string);
    return v != nullptr ? *v : Value::undefined(key.string);
  }
  if (key.kind == Value::Kind::kInt && obj.kind == Value::Kind::kList) {
    const int64_t i = sequence_index(key.integer, static_cast<int64_t>(obj.list->size()));
    return i >= 0 ? (*obj.list)[static_cast<size_t>(i)] : Value::undefined(fmt::format("[{}]", key.integer));
  }
  if (key.kind == Value::Kind::kInt && obj.is_string()) {
    const std::u32string s = code_points(obj.string);
    const int64_t i = sequence_index(key.integer, static_cast<int64_t>(s.size()));
    if (i < 0) return Value::undefined(fmt::format("[{}]", key.integer));
    Value character = Value::from(utf8(s.substr(static_cast<size_t>(i), 1)));
    character.is_markup = obj.is_markup;  // Markup's [i] is Markup
    return character;
  }
  return Value::undefined(python_str(key));
}

namespace {

// Python's slice [start:stop:step] of a sequence of `size`: the indices taken.
std::vector<int64_t> slice_indices(const Value& start, const Value& stop, const Value& step, int64_t size) {
  const auto integer = [](const Value& v, const char* what) {
    if (v.kind != Value::Kind::kInt) template_error(fmt::format("slice {} must be an integer or none", what));
    return v.integer;
  };
  const int64_t st = step.kind == Value::Kind::kNone ? 1 : integer(step, "step");
  if (st == 0) template_error("slice step cannot be zero");
  const auto clamp = [&](const Value& v, int64_t fallback, const char* what) {
    if (v.kind == Value::Kind::kNone) return fallback;
    int64_t i = integer(v, what);
    if (i < 0) i += size;
    return st > 0 ? std::clamp<int64_t>(i, 0, size) : std::clamp<int64_t>(i, -1, size - 1);
  };
  const int64_t begin = clamp(start, st > 0 ? 0 : size - 1, "start");
  const int64_t end = clamp(stop, st > 0 ? size : -1, "stop");
  std::vector<int64_t> out;
  for (int64_t i = begin; st > 0 ? i < end : i > end;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, st, &i)) break;  // past every index
  }
  return out;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) undefined_error(a, line);
  if (b.is_undefined()) undefined_error(b, line);
  const bool ints = a.is_number() && b.is_number() && a.kind != Value::Kind::kFloat && b.kind != Value::Kind::kFloat;
  const auto as_int = [](const Value& v) { return v.kind == Value::Kind::kBool ? int64_t{v.boolean} : v.integer; };
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return ints ? Value::from(checked_add(as_int(a), as_int(b))) : Value::from(x + y);
    if (op == "-") return ints ? Value::from(checked_sub(as_int(a), as_int(b))) : Value::from(x - y);
    if (op == "*") return ints ? Value::from(checked_mul(as_int(a), as_int(b))) : Value::from(x * y);
    if (op == "**") {
      if (ints && as_int(b) >= 0) return Value::from(checked_pow(as_int(a), as_int(b)));
      return Value::from(std::pow(x, y));
    }
    if (y == 0.0) template_error(fmt::format("division by zero (line {})", line));
    if (op == "/") return Value::from(x / y);
    if (op == "//") return ints ? Value::from(floor_div(as_int(a), as_int(b))) : Value::from(std::floor(x / y));
    if (op == "%") {
      if (ints) return Value::from(floor_mod(as_int(a), as_int(b)));
      return Value::from(x - std::floor(x / y) * y);
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    check_size(a.string.size() + b.string.size(), line);
    if (!a.is_markup && !b.is_markup) return Value::from(a.string + b.string);
    // Markup + str escapes the str (either side), and stays Markup.
    Value joined = Value::from((a.is_markup ? a.string : html_escape(a.string)) +
                               (b.is_markup ? b.string : html_escape(b.string)));
    joined.is_markup = true;
    return joined;
  }
  if (op == "+" && a.kind == Value::Kind::kList && b.kind == Value::Kind::kList) {
    check_items(a.list->size() + b.list->size(), line);
    List joined = *a.list;
    joined.insert(joined.end(), b.list->begin(), b.list->end());
    return Value::from(std::move(joined));
  }
  if (op == "*" && (a.is_string() || a.kind == Value::Kind::kList) && b.kind == Value::Kind::kInt) {
    const size_t unit = a.is_string() ? a.string.size() : a.list->size();
    if (b.integer > 0 && unit > 0) {
      const size_t most = a.is_string() ? kMaxOutputBytes : kMaxListItems;
      const size_t size = static_cast<uint64_t>(b.integer) > most ? most + 1 : unit * static_cast<size_t>(b.integer);
      a.is_string() ? check_size(size, line) : check_items(size, line);
    }
    if (a.is_string()) {
      Value repeated = Value::from(std::string());
      for (int64_t i = 0; i < b.integer; ++i) repeated.string += a.string;
      repeated.is_markup = a.is_markup;
      return repeated;
    }
    List l;
    for (int64_t i = 0; i < b.integer; ++i) l.insert(l.end(), a.list->begin(), a.list->end());
    return Value::from(std::move(l));
  }
  template_error(fmt::format("unsupported operand types for {}: '{}' and '{}' (line {})", op, kind_name(a.kind),
                             kind_name(b.kind), line));
}

bool contains(const Value& container, const Value& item, int line) {
  switch (container.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) template_error(fmt::format("'in <string>' needs a string on the left (line {})", line));
      return container.string.find(item.string) != std::string::npos;
    case Value::Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(), [&](const Value& v) { return equal(v, item); });
    case Value::Kind::kDict: return item.is_string() && container.find(item.string) != nullptr;
    default: template_error(fmt::format("'in' needs a string, list or dict, got {} (line {})",
                                        kind_name(container.kind), line));
  }
}

// The items a for loop visits: a list's elements, a dict's keys, a string's characters.
List iteration_items(const Value& v, int line) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return *v.list;
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, value] : *v.dict) keys.push_back(Value::from(k));
      return keys;
    }
    case Value::Kind::kString: {
      List chars;
      for (char32_t c : code_points(v.string)) chars.push_back(Value::from(utf8(std::u32string(1, c))));
      return chars;
    }
    default: template_error(fmt::format("a {} is not iterable (line {})", kind_name(v.kind), line));
  }
}

class Renderer {
 public:
  explicit Renderer(Scope& root) : root_(root) {}

  Flow body(const Body& nodes, Scope& scope, std::string& out) {
    for (const auto& n : nodes) {
      const Flow f = statement(*n, scope, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Value eval(const Expr& e, Scope& scope);

 private:
  Flow statement(const Node& n, Scope& scope, std::string& out);
  Flow for_loop(const Node& n, Scope& scope, std::string& out);
  void assign(const Node& n, Scope& scope);
  Value define_macro(const Node& n);
  void bind_parameters(const Node& n, const std::string& what, const CallArgs& args, Scope& scope);
  Flow filter_block(const Node& n, Scope& scope, std::string& out);
  void call_block(const Node& n, Scope& scope, std::string& out);
  Value item(const Value& obj, const Value& key, int line);
  Value attribute(const Value& obj, const std::string& name, int line);
  CallArgs arguments(const Expr& e, size_t first, Scope& scope);
  Value slice(const Expr& e, Scope& scope);
  Value dict_literal(const Expr& e, Scope& scope);
  Value binary(const Expr& e, Scope& scope);

  Scope& root_;
  int macro_depth_ = 0;
  int64_t iterations_ = 0;
};

Flow Renderer::statement(const Node& n, Scope& scope, std::string& out) {
  switch (n.kind) {
    case Node::Kind::kText:
    case Node::Kind::kOutput:
      out += n.kind == Node::Kind::kText ? n.text : python_str(eval(*n.exprs[0], scope));
      if (out.size() > kMaxOutputBytes) template_error(fmt::format("output past {} MiB", kMaxOutputBytes >> 20));
      return Flow::kNormal;
    case Node::Kind::kIf:
      for (size_t i = 0; i < n.exprs.size(); ++i)
        if (eval(*n.exprs[i], scope).truthy()) return body(n.bodies[i], scope, out);
      return n.has_else ? body(n.bodies.back(), scope, out) : Flow::kNormal;
    case Node::Kind::kFor: return for_loop(n, scope, out);
    case Node::Kind::kSet: assign(n, scope); return Flow::kNormal;
    case Node::Kind::kSetBlock: {
      std::string captured;
      Scope inner(&scope);
      body(n.bodies[0], inner, captured);
      scope.set(n.targets[0], Value::from(std::move(captured)));
      return Flow::kNormal;
    }
    case Node::Kind::kBreak: return Flow::kBreak;
    case Node::Kind::kContinue: return Flow::kContinue;
    case Node::Kind::kMacro: scope.set(n.macro_name, define_macro(n)); return Flow::kNormal;
    case Node::Kind::kPlain: return body(n.bodies[0], scope, out);
    case Node::Kind::kFilterBlock: return filter_block(n, scope, out);
    case Node::Kind::kCallBlock: call_block(n, scope, out); return Flow::kNormal;
  }
  return Flow::kNormal;
}

// The body rendered in its own scope, through the filters; a break or
// continue inside drops what it rendered (as Jinja2 does).
Flow Renderer::filter_block(const Node& n, Scope& scope, std::string& out) {
  std::string captured;
  Scope inner(&scope);
  const Flow flow = body(n.bodies[0], inner, captured);
  if (flow != Flow::kNormal) return flow;
  std::vector<const Expr*> chain;  // outermost filter first
  for (const Expr* e = n.exprs[0].get(); e->kind == Expr::Kind::kFilter; e = e->args[0].get()) chain.push_back(e);
  Value v = Value::from(std::move(captured));
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) v = apply_filter((*it)->name, v, arguments(**it, 1, scope));
  if (!v.is_string())  // Jinja2 joins the block's output as strings and fails too
    template_error(fmt::format("a filter block gives a {}, not a string (line {})", kind_name(v.kind), n.line));
  out += v.string;
  return Flow::kNormal;
}

// The call with `caller` added: a function rendering the body where the call
// block stands, its parameters bound; usable only while the block runs.
void Renderer::call_block(const Node& n, Scope& scope, std::string& out) {
  const auto running = std::make_shared<bool>(true);
  const Value caller = Value::from(Function([this, &n, &scope, running](const CallArgs& args) {
    if (!*running) template_error(fmt::format("caller() of the call block on line {} used after the block", n.line));
    NestingGuard guard(macro_depth_, kMaxMacroDepth, "caller() calls nested too deeply");
    Scope inner(&scope);
    bind_parameters(n, "caller", args, inner);
    std::string rendered;
    body(n.bodies[0], inner, rendered);
    return Value::from(std::move(rendered));
  }));
  const Expr& call = *n.exprs[0];
  const Value callee = eval(*call.args[0], scope);
  if (callee.is_undefined()) undefined_error(callee, n.line);
  if (callee.kind != Value::Kind::kFunction)
    template_error(fmt::format("a call block needs a macro, got {} (line {})", kind_name(callee.kind), n.line));
  CallArgs args = arguments(call, 1, scope);
  args.keyword.emplace_back("caller", caller);
  const Value result = (*callee.function)(args);
  *running = false;
  out += python_str(result);
}

bool mentions_name(const Expr& e, const std::string& name) {
  if (e.kind == Expr::Kind::kName && e.name == name) return true;
  for (const auto& a : e.args)
    if (a && mentions_name(*a, name)) return true;
  for (const auto& [key, value] : e.keyword_args)
    if (mentions_name(*value, name)) return true;
  return false;
}

bool mentions_name(const Body& nodes, const std::string& name) {
  for (const auto& n : nodes) {
    for (const auto& e : n->exprs)
      if (mentions_name(*e, name)) return true;
    for (const auto& b : n->bodies)
      if (mentions_name(b, name)) return true;
    for (const auto& [param, fallback] : n->params)
      if (fallback && mentions_name(*fallback, name)) return true;
  }
  return false;
}

void bind_targets(const std::vector<std::string>& targets, const Value& v, Scope& scope, int line) {
  if (targets.size() == 1) {
    scope.set(targets[0], v);
    return;
  }
  if (v.kind != Value::Kind::kList || v.list->size() != targets.size())
    template_error(fmt::format("cannot unpack a {} into {} names (line {})", kind_name(v.kind), targets.size(), line));
  for (size_t i = 0; i < targets.size(); ++i) scope.set(targets[i], (*v.list)[i]);
}

Flow Renderer::for_loop(const Node& n, Scope& scope, std::string& out) {
  List items = iteration_items(eval(*n.exprs[0], scope), n.line);
  if (n.has_filter) {
    List kept;
    for (const Value& v : items) {
      Scope filter_scope(&scope);
      bind_targets(n.targets, v, filter_scope, n.line);
      if (eval(*n.exprs[1], filter_scope).truthy()) kept.push_back(v);
    }
    items = std::move(kept);
  }
  const auto length = static_cast<int64_t>(items.size());
  const auto last_changed = std::make_shared<Value>();  // loop.changed's last arguments (undefined: none yet)
  for (int64_t i = 0; i < length; ++i) {
    if (++iterations_ > kMaxLoopIterations)
      template_error(fmt::format("more than {} loop iterations (line {})", kMaxLoopIterations, n.line));
    // Each iteration starts from the enclosing scope: what one sets, the next does not see (as in Jinja2).
    Scope loop_scope(&scope);
    bind_targets(n.targets, items[static_cast<size_t>(i)], loop_scope, n.line);
    Dict loop = {{"index", Value::from(i + 1)},
                 {"index0", Value::from(i)},
                 {"revindex", Value::from(length - i)},
                 {"revindex0", Value::from(length - i - 1)},
                 {"first", Value::from(i == 0)},
                 {"last", Value::from(i == length - 1)},
                 {"length", Value::from(length)},
                 {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem")},
                 {"nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem")},
                 {"cycle", Value::from(Function([i](const CallArgs& a) {
                    if (a.positional.empty()) template_error("loop.cycle needs at least one value");
                    return a.positional[static_cast<size_t>(i) % a.positional.size()];
                  }))},
                 {"changed", Value::from(Function([last_changed](const CallArgs& a) {
                    Value arguments = Value::from(a.positional);
                    arguments.is_tuple = true;
                    if (!a.keyword.empty()) template_error("loop.changed takes no keyword arguments");
                    if (!last_changed->is_undefined() && equal(*last_changed, arguments)) return Value::from(false);
                    *last_changed = std::move(arguments);
                    return Value::from(true);
                  }))},
                 {"depth", Value::from(int64_t{1})},  // no recursive loops: always the outermost level
                 {"depth0", Value::from(int64_t{0})}};
    loop_scope.set("loop", Value::from(std::move(loop)));
    if (body(n.bodies[0], loop_scope, out) == Flow::kBreak) break;
  }
  if (length == 0 && n.has_else) {
    Scope else_scope(&scope);
    return body(n.bodies[1], else_scope, out);
  }
  return Flow::kNormal;
}

void Renderer::assign(const Node& n, Scope& scope) {
  Value v = eval(*n.exprs[0], scope);
  if (n.attribute.empty()) {
    bind_targets(n.targets, v, scope, n.line);
    return;
  }
  const Value* target = scope.lookup(n.targets[0]);
  if (target == nullptr || !target->is_namespace)
    template_error(fmt::format("'{}' is not a namespace(): cannot set '{}.{}' (line {})", n.targets[0], n.targets[0],
                               n.attribute, n.line));
  for (auto& [key, value] : *target->dict) {
    if (key == n.attribute) {
      value = std::move(v);
      return;
    }
  }
  target->dict->emplace_back(n.attribute, std::move(v));
}

void Renderer::bind_parameters(const Node& n, const std::string& what, const CallArgs& args, Scope& scope) {
  if (args.positional.size() > n.params.size())
    template_error(fmt::format("{} takes {} arguments, got {}", what, n.params.size(), args.positional.size()));
  for (size_t i = 0; i < n.params.size(); ++i) {
    const auto& [name, fallback] = n.params[i];
    const Value* given = args.get(i, name.c_str());
    scope.set(name, given != nullptr ? *given : fallback ? eval(*fallback, scope) : Value::undefined(name));
  }
}

Value Renderer::define_macro(const Node& n) {
  const bool takes_caller = mentions_name(n.bodies[0], "caller");
  return Value::from(Function([this, &n, takes_caller](const CallArgs& args) {
    NestingGuard guard(macro_depth_, kMaxMacroDepth, fmt::format("macro '{}' calls nested too deeply", n.macro_name));
    Scope scope(&root_);
    bind_parameters(n, fmt::format("macro '{}'", n.macro_name), args, scope);
    for (const auto& [key, value] : args.keyword) {
      if (key != "caller") continue;
      if (!takes_caller)  // Jinja2 passes caller only to a macro that uses it
        template_error(fmt::format("macro '{}' was called from a call block but does not use caller()", n.macro_name));
      scope.set("caller", value);
    }
    std::string out;
    body(n.bodies[0], scope, out);
    return Value::from(std::move(out));
  }));
}

Value Renderer::attribute(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  Value m = method(obj, name);
  if (!m.is_undefined()) return m;
  if (const Value* v = obj.find(name)) return *v;
  if (obj.kind == Value::Kind::kDict) return Value::undefined(name);
  return Value::undefined(fmt::format("a {} has no attribute '{}'", kind_name(obj.kind), name));
}

Value Renderer::item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) undefined_error(obj, line);
  if (key.is_undefined()) undefined_error(key, line);
  // obj["name"] of a value that is not a dict: its attribute (methods included).
  if (key.is_string() && obj.kind != Value::Kind::kDict) return attribute(obj, key.string, line);
  return subscript(obj, key);
}

CallArgs Renderer::arguments(const Expr& e, size_t first, Scope& scope) {
  CallArgs args;
  for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
  for (const auto& [key, value] : e.keyword_args) args.keyword.emplace_back(key, eval(*value, scope));
  return args;
}

Value Renderer::slice(const Expr& e, Scope& scope) {
  const Value obj = eval(*e.args[0], scope);
  if (obj.is_undefined()) undefined_error(obj, e.line);
  if (obj.kind != Value::Kind::kList && !obj.is_string())
    template_error(fmt::format("cannot slice a {} (line {})", kind_name(obj.kind), e.line));
  const std::u32string chars = obj.is_string() ? code_points(obj.string) : std::u32string();
  const auto size = static_cast<int64_t>(obj.is_string() ? chars.size() : obj.list->size());
  const auto indices =
      slice_indices(eval(*e.args[1], scope), eval(*e.args[2], scope), eval(*e.args[3], scope), size);
  if (obj.is_string()) {
    std::u32string s;
    for (int64_t i : indices) s.push_back(chars[static_cast<size_t>(i)]);
    Value sliced = Value::from(utf8(s));
    sliced.is_markup = obj.is_markup;
    return sliced;
  }
  List l;
  for (int64_t i : indices) l.push_back((*obj.list)[static_cast<size_t>(i)]);
  return Value::from(std::move(l));
}

Value Renderer::dict_literal(const Expr& e, Scope& scope) {
  Dict d;
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    const Value key = eval(*e.args[i], scope);
    if (!key.is_string()) template_error(fmt::format("dict keys must be strings (line {})", e.line));
    if (key.is_markup) template_error(fmt::format("an escaped (Markup) dict key is not supported (line {})", e.line));
    Value value = eval(*e.args[i + 1], scope);
    auto it = std::find_if(d.begin(), d.end(), [&](const auto& kv) { return kv.first == key.string; });
    if (it != d.end()) it->second = std::move(value);
    else d.emplace_back(key.string, std::move(value));
  }
  return Value::from(std::move(d));
}

Value Renderer::binary(const Expr& e, Scope& scope) {
  const Value a = eval(*e.args[0], scope), b = eval(*e.args[1], scope);
  if (e.name == "~") {
    std::string joined = python_str(a) + python_str(b);
    check_size(joined.size(), e.line);
    return Value::from(std::move(joined));
  }
  if (e.name == "==") return Value::from(equal(a, b));
  if (e.name == "!=") return Value::from(!equal(a, b));
  if (e.name == "<") return Value::from(less(a, b));
  if (e.name == ">") return Value::from(less(b, a));
  if (e.name == "<=") return Value::from(!less(b, a));
  if (e.name == ">=") return Value::from(!less(a, b));
  if (e.name == "in") return Value::from(contains(b, a, e.line));
  if (e.name == "not in") return Value::from(!contains(b, a, e.line));
  return arithmetic(e.name, a, b, e.line);
}

Value Renderer::eval(const Expr& e, Scope& scope) {
  switch (e.kind) {
    case Expr::Kind::kLiteral: return e.literal;
    case Expr::Kind::kName: {
      const Value* v = scope.lookup(e.name);
      return v != nullptr ? *v : Value::undefined(e.name);
    }
    case Expr::Kind::kList: {
      List l;
      for (const auto& a : e.args) l.push_back(eval(*a, scope));
      Value v = Value::from(std::move(l));
      v.is_tuple = e.name == "tuple";
      return v;
    }
    case Expr::Kind::kDict: return dict_literal(e, scope);
    case Expr::Kind::kAttr: return attribute(eval(*e.args[0], scope), e.name, e.line);
    case Expr::Kind::kItem: return item(eval(*e.args[0], scope), eval(*e.args[1], scope), e.line);
    case Expr::Kind::kSlice: return slice(e, scope);
    case Expr::Kind::kCall: {
      const Value callee = eval(*e.args[0], scope);
      if (callee.is_undefined()) undefined_error(callee, e.line);
      if (callee.kind != Value::Kind::kFunction)
        template_error(fmt::format("a {} is not callable (line {})", kind_name(callee.kind), e.line));
      return (*callee.function)(arguments(e, 1, scope));
    }
    case Expr::Kind::kFilter: return apply_filter(e.name, eval(*e.args[0], scope), arguments(e, 1, scope));
    case Expr::Kind::kTest: return Value::from(apply_test(e.name, eval(*e.args[0], scope), arguments(e, 1, scope)));
    case Expr::Kind::kUnary: {
      const Value v = eval(*e.args[0], scope);
      if (!v.is_number()) template_error(fmt::format("bad operand for unary {}: {} (line {})", e.name,
                                                     kind_name(v.kind), e.line));
      if (e.name == "+") return v;
      return v.kind == Value::Kind::kFloat
                 ? Value::from(-v.number)
                 : Value::from(checked_neg(v.kind == Value::Kind::kBool ? int64_t{v.boolean} : v.integer));
    }
    case Expr::Kind::kBinary: return binary(e, scope);
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::kNot: return Value::from(!eval(*e.args[0], scope).truthy());
    case Expr::Kind::kCondition:
      return eval(*e.args[0], scope).truthy() ? eval(*e.args[1], scope) : eval(*e.args[2], scope);
  }
  return Value::undefined();
}

}  // namespace

std::string render(const Body& body, const std::map<std::string, Value>& globals) {
  Scope root(nullptr);
  for (const auto& [name, value] : globals) root.set(name, value);
  Renderer renderer(root);
  std::string out;
  renderer.body(body, root, out);
  return out;
}

}  // namespace lockstep::jinja
