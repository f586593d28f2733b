// Stop strings: a request's text ends just before the first of them it
// contains, as vLLM's `stop` and llama.cpp's reverse prompts end it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace lockstep {

// Fails (kInvalidArgument) on an empty stop string (every text contains it,
// so it would end a request before its first token) or one that is not valid
// UTF-8 (the text, always valid UTF-8, could never contain it).
void check_stop_strings(const std::vector<std::string>& stops);

// A request's generated ids as text, as StreamDecoder turns them out
// (complete UTF-8, invalid bytes as U+FFFD) with special tokens left out (as
// skip_special_tokens does), cut at its stop strings: once the text contains
// one, it ends just before the earliest occurrence and later ids are ignored.
// Incremental: each id's bytes are decoded once, and a stop string is only
// looked for where it could end in the new text, so a request costs time in
// proportion to its length. For streaming, take_ready() gives only text that
// no stop string can include any more: a tail that could be the start of one
// is held back until it cannot, or until the end (take_rest()).
class StopStringStream {
 public:
  StopStringStream(const Tokenizer& tokenizer, std::vector<std::string> stops);

  // The next generated id; true when the text now contains a stop string.
  bool push(int32_t id);
  // The text not taken yet that no stop string can include any more.
  std::string take_ready();
  // At the end of the request: all the text not taken yet (the held-back
  // tail that completed no stop string, an incomplete UTF-8 end as U+FFFD).
  std::string take_rest();

  // The text so far (after take_rest(), the request's whole text).
  const std::string& text() const { return text_; }
  bool stopped() const { return stopped_; }

 private:
  // The longest tail of the text that is the start of a stop string.
  size_t held_back() const;

  const Tokenizer* tokenizer_;
  StreamDecoder decoder_;
  std::vector<std::string> stops_;
  std::string text_;
  size_t taken_ = 0;  // bytes of text_ handed out
  bool stopped_ = false;
};

}  // namespace lockstep
