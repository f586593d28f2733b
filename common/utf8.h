// UTF-8 checks shared by the file readers, the tokenizer and the error lines.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lockstep {

// The UTF-8 sequence that starts at s[i], read by the table of well-formed
// byte sequences (the Unicode Standard, section 3.9, Table 3-7). Its first `length`
// bytes are complete (a whole character), truncated (a valid start that `s`
// ends in) or invalid (a valid start, possibly empty past the lead byte,
// that the next byte breaks: Unicode's "maximal subpart"; an invalid lead
// byte alone has length 1).
struct Utf8Sequence {
  enum Status { kComplete, kTruncated, kInvalid };
  size_t length;
  Status status;
};
Utf8Sequence utf8_sequence_at(std::string_view s, size_t i);

// How bytes that are not valid UTF-8 become U+FFFD when text is shown, as
// Hugging Face's tokenizer decoders do it.
enum class Utf8Repair {
  // One per maximal subpart (Unicode's recommended practice): the ByteLevel
  // decoder (Rust's String::from_utf8_lossy), Python's errors="replace".
  kMaximalSubpart,
  // One per byte: the ByteFallback decoder (SentencePiece byte tokens).
  kEachByte,
};

// Takes from the front of `bytes` everything that can be decided, with
// invalid bytes repaired; leaves in `bytes` a truncated tail, if any (the
// start of a character that later bytes may complete).
std::string take_complete_utf8(std::string& bytes, Utf8Repair repair);

// A truncated tail left by take_complete_utf8, repaired (the text ended).
std::string repair_truncated_utf8(std::string_view tail, Utf8Repair repair);

// The offset of the first byte that does not begin a valid UTF-8 sequence,
// or npos. As strict as Rust's str::from_utf8 (and the safetensors format):
// no overlong forms, no surrogates, nothing above U+10FFFF.
size_t find_invalid_utf8(std::string_view s);

// `s` safe to print on one line of a terminal: bytes that are not valid
// UTF-8 and control characters (newlines included) become \xNN escapes.
std::string printable(std::string_view s);

}  // namespace lockstep
