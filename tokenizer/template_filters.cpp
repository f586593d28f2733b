// The filters that sort, group, aggregate, cut up and round, with Jinja2
// 3.1's meanings: string keys compared case-insensitively unless
// case_sensitive (its ignore_case), Python's ordering (what Python cannot
// order fails) and Python's round().
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "tokenizer/template_internal.h"

namespace lockstep::jinja {

namespace {

using Kind = Value::Kind;

bool flag_arg(const CallArgs& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v != nullptr && v->truthy();
}

// An integer argument (a boolean counts, as in Python); `fallback` when absent or none.
int64_t integer_arg(const CallArgs& a, size_t i, const char* name, int64_t fallback, const std::string& filter) {
  const Value* v = a.get(i, name);
  if (v == nullptr || v->kind == Kind::kNone) return fallback;
  if (v->kind == Kind::kBool) return v->boolean ? 1 : 0;
  if (v->kind != Kind::kInt) template_error(fmt::format("{}: '{}' must be an integer, got {}", filter, name, kind_name(v->kind)));
  return v->integer;
}

// An optional argument; none counts as absent.
const Value* optional_arg(const CallArgs& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v != nullptr && v->kind != Kind::kNone ? v : nullptr;
}

// Fails naming `filter` unless Python can order `a` and `b` with < (lists:
// the first items that differ).
void check_orderable(const Value& a, const Value& b, const std::string& filter) {
  for (const Value* v : {&a, &b})
    if (v->is_undefined()) template_error(fmt::format("{}: '{}' is undefined", filter, v->undefined_name));
  if ((a.is_number() && b.is_number()) || (a.is_string() && b.is_string())) return;
  if (a.kind == Kind::kList && b.kind == Kind::kList && a.is_tuple == b.is_tuple) {
    for (size_t i = 0; i < a.list->size() && i < b.list->size(); ++i)
      if (!equal((*a.list)[i], (*b.list)[i])) return check_orderable((*a.list)[i], (*b.list)[i], filter);
    return;
  }
  template_error(fmt::format("{}: cannot compare {} with {}", filter, a.is_tuple ? "tuple" : kind_name(a.kind),
                             b.is_tuple ? "tuple" : kind_name(b.kind)));
}

// a < b as Python orders them.
bool ordered_before(const Value& a, const Value& b, const std::string& filter) {
  check_orderable(a, b, filter);
  return less(a, b);
}

// Jinja's make_attrgetter: the item's attribute (the item without one, else
// `fallback` where it is undefined), lower-cased when a string and not case-sensitive.
Value key_of(const Value& item, const Value* attribute, bool case_sensitive, const Value* fallback = nullptr) {
  Value v = attribute != nullptr ? attribute_of(item, *attribute, fallback) : item;
  if (!case_sensitive && v.is_string()) return Value::from(map_case(v.string, 0));
  return v;
}

// Indices of `keys` in Python's stable sorted() order.
std::vector<size_t> sorted_order(const List& keys, bool reverse, const std::string& filter) {
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return reverse ? ordered_before(keys[y], keys[x], filter) : ordered_before(keys[x], keys[y], filter);
  });
  return order;
}

// sort(reverse, case_sensitive, attribute): the key of each item is the list
// of its comma-separated attributes (make_multi_attrgetter), or [item].
Value sort_filter(const Value& input, const CallArgs& a) {
  const bool reverse = flag_arg(a, 0, "reverse"), case_sensitive = flag_arg(a, 1, "case_sensitive");
  const Value* attribute = optional_arg(a, 2, "attribute");
  List attributes;
  if (attribute != nullptr && attribute->is_string()) {
    for (size_t start = 0;;) {
      const size_t comma = attribute->string.find(',', start);
      attributes.push_back(Value::from(attribute->string.substr(start, comma == std::string::npos ? comma : comma - start)));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else if (attribute != nullptr) {
    attributes.push_back(*attribute);
  }
  const List items = as_list(input);
  List keys;
  for (const Value& item : items) {
    List key;
    if (attributes.empty()) key.push_back(key_of(item, nullptr, case_sensitive));
    for (const Value& attr : attributes) key.push_back(key_of(item, &attr, case_sensitive));
    keys.push_back(Value::from(std::move(key)));
  }
  List out;
  for (size_t i : sorted_order(keys, reverse, "sort")) out.push_back(items[i]);
  return Value::from(std::move(out));
}

// dictsort(case_sensitive, by, reverse): the (key, value) tuples sorted by key or value.
Value dictsort_filter(const Value& input, const CallArgs& a) {
  if (input.kind != Kind::kDict || input.is_namespace)
    template_error(fmt::format("dictsort needs a dict, got {}", kind_name(input.kind)));
  const bool case_sensitive = flag_arg(a, 0, "case_sensitive"), reverse = flag_arg(a, 2, "reverse");
  const Value by = arg_or(a, 1, "by", Value::from("key"));
  if (!by.is_string() || (by.string != "key" && by.string != "value"))
    template_error("dictsort: by must be 'key' or 'value'");
  List items, keys;
  for (const auto& [k, v] : *input.dict) {
    items.push_back(Value::from(List{Value::from(k), v}));
    items.back().is_tuple = true;
    keys.push_back(key_of(by.string == "key" ? Value::from(k) : v, nullptr, case_sensitive));
  }
  List out;
  for (size_t i : sorted_order(keys, reverse, "dictsort")) out.push_back(items[i]);
  return Value::from(std::move(out));
}

// min / max(case_sensitive, attribute): the first smallest or largest item; undefined when empty.
Value extreme_filter(const std::string& name, const Value& input, const CallArgs& a) {
  const bool case_sensitive = flag_arg(a, 0, "case_sensitive");
  const Value* attribute = optional_arg(a, 1, "attribute");
  const List items = as_list(input);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key = key_of(items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = key_of(items[i], attribute, case_sensitive);
    if (name == "min" ? ordered_before(key, best_key, name) : ordered_before(best_key, key, name)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

// Whether Python can hash `v` (unique keeps a set of keys).
bool hashable(const Value& v) {
  if (v.kind == Kind::kDict) return false;
  if (v.kind != Kind::kList) return true;
  return v.is_tuple && std::all_of(v.list->begin(), v.list->end(), hashable);
}

// unique(case_sensitive, attribute): the first item of each key.
Value unique_filter(const Value& input, const CallArgs& a) {
  const bool case_sensitive = flag_arg(a, 0, "case_sensitive");
  const Value* attribute = optional_arg(a, 1, "attribute");
  List out, seen;
  for (const Value& item : as_list(input)) {
    const Value key = key_of(item, attribute, case_sensitive);
    if (!hashable(key)) template_error(fmt::format("unique: a {} cannot be hashed", kind_name(key.kind)));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::from(std::move(out));
}

// groupby(attribute, default, case_sensitive): (grouper, list) tuples in key
// order, each grouper as the group's first item has it.
Value groupby_filter(const Value& input, const CallArgs& a) {
  const Value* attribute = optional_arg(a, 0, "attribute");
  if (attribute == nullptr) template_error("groupby needs an attribute");
  const Value* fallback = optional_arg(a, 1, "default");
  const bool case_sensitive = flag_arg(a, 2, "case_sensitive");
  const List items = as_list(input);
  List keys;
  for (const Value& item : items) keys.push_back(key_of(item, attribute, case_sensitive, fallback));
  List groups;
  const Value* group_key = nullptr;
  for (size_t i : sorted_order(keys, false, "groupby")) {
    if (group_key == nullptr || !equal(*group_key, keys[i])) {
      Value group = Value::from(List{key_of(items[i], attribute, true, fallback), Value::from(List{})});
      group.is_tuple = group.is_group = true;
      groups.push_back(std::move(group));
      group_key = &keys[i];
    }
    (*groups.back().list)[1].list->push_back(items[i]);
  }
  return Value::from(std::move(groups));
}

// sum(attribute, start): Python's sum(), numbers left to right (or lists onto a list start).
Value sum_filter(const Value& input, const CallArgs& a) {
  const Value* attribute = optional_arg(a, 0, "attribute");
  Value total = arg_or(a, 1, "start", Value::from(int64_t{0}));
  if (total.is_string()) template_error("sum: cannot sum strings");
  for (const Value& item : as_list(input)) {
    const Value v = attribute != nullptr ? attribute_of(item, *attribute) : item;
    if (total.is_number() && v.is_number() && total.kind != Kind::kFloat && v.kind != Kind::kFloat) {
      const int64_t x = total.kind == Kind::kBool ? total.boolean : total.integer;
      int64_t sum = 0;
      if (__builtin_add_overflow(x, v.kind == Kind::kBool ? int64_t{v.boolean} : v.integer, &sum))
        template_error("sum: integer overflow");
      total = Value::from(sum);
    } else if (total.is_number() && v.is_number()) {
      total = Value::from(total.as_double() + v.as_double());
    } else if (total.kind == Kind::kList && v.kind == Kind::kList && total.is_tuple == v.is_tuple) {
      List joined = *total.list;
      joined.insert(joined.end(), v.list->begin(), v.list->end());
      const bool tuple = total.is_tuple;
      total = Value::from(std::move(joined));
      total.is_tuple = tuple;
    } else {
      if (v.is_undefined()) template_error(fmt::format("sum: '{}' is undefined", v.undefined_name));
      template_error(fmt::format("sum: cannot add {} to {}", kind_name(v.kind), kind_name(total.kind)));
    }
  }
  return total;
}

// batch(linecount, fill_with): lists of `linecount` items, the last filled up.
Value batch_filter(const Value& input, const CallArgs& a) {
  if (a.get(0, "linecount") == nullptr) template_error("batch needs a linecount");
  const int64_t count = integer_arg(a, 0, "linecount", 0, "batch");
  const Value* fill = optional_arg(a, 1, "fill_with");
  List out, row;
  for (const Value& item : as_list(input)) {
    if (static_cast<int64_t>(row.size()) == count) out.push_back(Value::from(std::exchange(row, List{})));
    row.push_back(item);
  }
  if (!row.empty()) {
    while (fill != nullptr && static_cast<int64_t>(row.size()) < count) row.push_back(*fill);
    out.push_back(Value::from(std::move(row)));
  }
  return Value::from(std::move(out));
}

// slice(slices, fill_with): the items in `slices` columns, the first ones
// longer by one, the others filled up by one.
Value slice_filter(const Value& input, const CallArgs& a) {
  if (a.get(0, "slices") == nullptr) template_error("slice needs a number of slices");
  const int64_t slices = integer_arg(a, 0, "slices", 0, "slice");
  if (slices == 0) template_error("slice: zero slices (division by zero)");
  if (slices > static_cast<int64_t>(kMaxListItems)) template_error(fmt::format("slice: more than {} slices", kMaxListItems));
  const Value* fill = optional_arg(a, 1, "fill_with");
  const List items = as_list(input);
  const auto length = static_cast<int64_t>(items.size());
  List out;
  for (int64_t n = 0, offset = 0; n < slices; ++n) {
    const int64_t start = offset + n * (length / slices);
    if (n < length % slices) ++offset;
    const int64_t end = offset + (n + 1) * (length / slices);
    List column(items.begin() + start, items.begin() + end);
    if (fill != nullptr && n >= length % slices) column.push_back(*fill);
    out.push_back(Value::from(std::move(column)));
  }
  return Value::from(std::move(out));
}

// Python's round(x, ndigits) of a float, ndigits >= 0: the correctly rounded
// decimal (ties to even on the exact binary value), read back.
double python_round(double x, int64_t ndigits) {
  if (ndigits > 323 || !std::isfinite(x)) return x;
  std::vector<char> text(700);
  std::snprintf(text.data(), text.size(), "%.*f", static_cast<int>(ndigits), x);
  return std::strtod(text.data(), nullptr);
}

// round(precision, method): 'common' is Python's round() (an integer stays
// an integer), 'ceil' and 'floor' math's on x * 10**precision, divided back.
Value round_filter(const Value& input, const CallArgs& a) {
  const int64_t precision = integer_arg(a, 0, "precision", 0, "round");
  const Value method = arg_or(a, 1, "method", Value::from("common"));
  if (!method.is_string() || (method.string != "common" && method.string != "ceil" && method.string != "floor"))
    template_error("round: method must be common, ceil or floor");
  if (!input.is_number()) template_error(fmt::format("round needs a number, got {}", kind_name(input.kind)));
  if (method.string == "common") {
    if (input.kind != Kind::kFloat) {
      if (precision < 0) template_error("round: a negative precision of an integer is not supported");
      return Value::from(input.kind == Kind::kBool ? int64_t{input.boolean} : input.integer);
    }
    if (precision < 0) template_error("round: a negative precision is not supported");
    return Value::from(python_round(input.number, precision));
  }
  if (precision > 22 || precision < -22) template_error("round: a precision past 22 digits is not supported");
  if (input.kind == Kind::kInt && (input.integer > (int64_t{1} << 53) || input.integer < -(int64_t{1} << 53)))
    template_error("round: an integer past 2**53 is not supported");
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = input.as_double() * scale;
  if (!std::isfinite(scaled)) template_error("round: cannot round an infinite or nan value");
  return Value::from((method.string == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

}  // namespace

std::optional<Value> collection_filter(const std::string& name, const Value& input, const CallArgs& a) {
  if (name == "sort") return sort_filter(input, a);
  if (name == "dictsort") return dictsort_filter(input, a);
  if (name == "min" || name == "max") return extreme_filter(name, input, a);
  if (name == "unique") return unique_filter(input, a);
  if (name == "groupby") return groupby_filter(input, a);
  if (name == "sum") return sum_filter(input, a);
  if (name == "batch") return batch_filter(input, a);
  if (name == "slice") return slice_filter(input, a);
  if (name == "round") return round_filter(input, a);
  return std::nullopt;
}

}  // namespace lockstep::jinja
