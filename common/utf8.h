// UTF-8 checks shared by the file readers, the tokenizer and the error lines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

// The offset of the first byte that does not begin a valid UTF-8 sequence,
// or npos. As strict as Rust's str::from_utf8 (and the safetensors format):
// no overlong forms, no surrogates, nothing above U+10FFFF.
size_t find_invalid_utf8(std::string_view s);

// `s` safe to print on one line of a terminal: bytes that are not valid
// UTF-8 and control characters (newlines included) become \xNN escapes.
std::string printable(std::string_view s);

}  // namespace lockstep
