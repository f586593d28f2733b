// The Split pre-tokenizer's regex through PCRE2 (UTF + UCP, JIT-compiled).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"
#include "tokenizer/tok_internal.h"

namespace lockstep::tok_detail {
namespace {

// Unicode White_Space, which is what Oniguruma's \s matches. PCRE2's \s under
// UCP also matches U+180E, so \s and \S are spelled out explicitly.
constexpr const char* kWhiteSpaceClass =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Per-thread match data and JIT stack (shared by all patterns).
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(4, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    LS_REQUIRE(data && context && stack, ErrorKind::kInternal, "PCRE2 allocation failed");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string rewrite_regex_for_pcre2(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char n = pattern[++i];
      if (n == 's') {
        out += in_class ? std::string(kWhiteSpaceClass) : fmt::format("[{}]", kWhiteSpaceClass);
      } else if (n == 'S' && !in_class) {
        out += fmt::format("[^{}]", kWhiteSpaceClass);
      } else {
        out.push_back('\\');
        out.push_back(n);
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      // A ']' or '^]' right after '[' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out.push_back(pattern[++i]);
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
  }
  return out;
}

std::string escape_regex_literal(const std::string& literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

RegexSplitter::RegexSplitter(const std::string& pattern) {
  std::string rewritten = rewrite_regex_for_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  LS_REQUIRE(code != nullptr, ErrorKind::kModel,
             "tokenizer.json: Split regex does not compile at offset {}: {}", offset,
             pcre2_message(error));
  int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  if (jit != 0) {
    pcre2_code_free(code);
    LS_FAIL(ErrorKind::kModel, "tokenizer.json: Split regex cannot be JIT-compiled: {}",
            pcre2_message(jit));
  }
  // A (*NO_JIT) verb makes pcre2_jit_compile succeed without JIT code, and
  // every pcre2_jit_match then fail: refuse the pattern here instead.
  size_t jit_size = 0;
  if (pcre2_pattern_info(code, PCRE2_INFO_JITSIZE, &jit_size) != 0 || jit_size == 0) {
    pcre2_code_free(code);
    LS_FAIL(ErrorKind::kModel, "tokenizer.json: Split regex cannot be JIT-compiled (it turns JIT off: (*NO_JIT))");
  }
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, size_t base,
                          std::vector<std::pair<size_t, size_t>>& pieces) const {
  MatchState& state = match_state();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t last = 0;  // end of the previous piece
  while (pos <= text.size()) {
    int rc = pcre2_jit_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, state.data,
                             state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    // A pattern that backtracks past PCRE2's match or depth limit on this
    // text is the tokenizer's problem, not the engine's.
    LS_REQUIRE(rc >= 0, ErrorKind::kModel, "tokenizer.json: a Split regex failed on the text: {}", pcre2_message(rc));
    PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    size_t begin = ovector[0];
    size_t end = ovector[1];
    if (begin > last) pieces.emplace_back(base + last, base + begin);
    if (end > begin) {
      pieces.emplace_back(base + begin, base + end);
      last = end;
      pos = end;
    } else {
      // Empty match: step over one character.
      last = begin;
      pos = begin;
      if (pos >= text.size()) break;
      next_code_point(text, pos);
    }
  }
  if (last < text.size()) pieces.emplace_back(base + last, base + text.size());
}

}  // namespace lockstep::tok_detail
