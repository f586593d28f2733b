#include "common/integers.h"

#include <exception>

#include "common/error.h"

namespace lockstep {

std::optional<long long> whole_integer(const std::string& text) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return used == text.size() && !text.empty() ? std::optional<long long>(v) : std::nullopt;
}

std::vector<int64_t> parse_int_list(const std::string& text, const char* option, const char* what) {
  std::vector<int64_t> values;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const std::optional<long long> v = whole_integer(item);
    LS_REQUIRE(v.has_value(), ErrorKind::kInvalidArgument, "{}: '{}' is not an integer {} (or is out of range)",
               option, item, what);
    values.push_back(*v);
    if (comma == std::string::npos) return values;
    start = comma + 1;
  }
}

}  // namespace lockstep
