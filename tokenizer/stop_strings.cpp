#include "tokenizer/stop_strings.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "common/error.h"
#include "common/utf8.h"

namespace lockstep {

void check_stop_strings(const std::vector<std::string>& stops) {
  for (const std::string& stop : stops) {
    LS_REQUIRE(!stop.empty(), ErrorKind::kInvalidArgument,
               "a stop string is empty (it would end the request before its first token)");
    LS_REQUIRE(find_invalid_utf8(stop) == std::string_view::npos, ErrorKind::kInvalidArgument,
               "stop string '{}' is not valid UTF-8", stop);
  }
}

StopStringStream::StopStringStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : tokenizer_(&tokenizer), decoder_(tokenizer), stops_(std::move(stops)) {
  check_stop_strings(stops_);
}

bool StopStringStream::push(int32_t id) {
  if (stopped_ || tokenizer_->is_special(id)) return stopped_;
  const size_t before = text_.size();
  text_ += decoder_.push(id);
  // The text before held no stop string, so one now ends in the new piece:
  // it starts at most its length - 1 bytes before the piece.
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t from = before - std::min(before, stop.size() - 1);
    earliest = std::min(earliest, text_.find(stop, from));
  }
  if (earliest != std::string::npos) {
    text_.resize(earliest);
    stopped_ = true;
  }
  return stopped_;
}

size_t StopStringStream::held_back() const {
  size_t longest = 0;
  const std::string_view text(text_);
  for (const std::string& stop : stops_) {
    // Shorter than the stop string: the whole of it would have ended the text.
    for (size_t n = std::min(stop.size() - 1, text.size()); n > longest; --n)
      if (text.substr(text.size() - n) == std::string_view(stop).substr(0, n)) {
        longest = n;
        break;
      }
  }
  return longest;
}

std::string StopStringStream::take_ready() {
  // A held-back tail starts no earlier than the one before it (a longer one
  // would have been held back then), so end never falls below taken_.
  const size_t end = stopped_ ? text_.size() : text_.size() - held_back();
  if (end <= taken_) return {};
  std::string ready = text_.substr(taken_, end - taken_);
  taken_ = end;
  return ready;
}

std::string StopStringStream::take_rest() {
  if (!stopped_) text_ += decoder_.flush();
  std::string rest = text_.substr(taken_);
  taken_ = text_.size();
  return rest;
}

}  // namespace lockstep
