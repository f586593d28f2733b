// Integers read from option text: the one way the commands (and the
// benchmarks) parse "12" and "1,8,32", failing on anything else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep {

// The integer that is the whole of `text` (no sign-only, spaces or suffix), if any.
std::optional<long long> whole_integer(const std::string& text);

// "1,2,3" -> integers; fails (kInvalidArgument) naming `option` and `what`
// (one item) on anything else, an empty item ("1,,2", "1,") included.
std::vector<int64_t> parse_int_list(const std::string& text, const char* option, const char* what);

}  // namespace lockstep
