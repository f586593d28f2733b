// UTF-8, Unicode and byte-level helpers of the tokenizer.
#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "common/error.h"
#include "tokenizer/tok_internal.h"

namespace lockstep::tok_detail {

char32_t next_code_point(std::string_view s, size_t& i) {
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    ++i;
    return c;
  }
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  }
  i += len;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Hugging Face tokenizers (0.23) normalizes with unicode-normalization-
// alignments 0.1.12, whose tables are Unicode 9.0: to it, code points assigned
// later are inert starters (combining class 0, no decomposition, no
// composition). These are the ones utf8proc (Unicode 15) would treat
// otherwise: assigned after 9.0 (Perl's \p{In=9.0} is false) with a non-zero
// combining class, a decomposition or a composition role in utf8proc 2.8.
struct CodePointRange {
  char32_t first, last;
};
constexpr CodePointRange kNewerThanUnicode9[] = {
    {0x7FD, 0x7FD}, {0x898, 0x89F}, {0x8CA, 0x8D3}, {0x9FE, 0x9FE}, {0xC3C, 0xC3C}, {0xD3B, 0xD3C},
    {0xEBA, 0xEBA}, {0x1715, 0x1715}, {0x1ABF, 0x1ACE}, {0x1DF6, 0x1DFA}, {0x32FF, 0x32FF},
    {0xA7F2, 0xA7F4}, {0xA82C, 0xA82C}, {0xAB69, 0xAB69}, {0x10781, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B},
    {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x11930, 0x11930}, {0x11935, 0x11935},
    {0x11938, 0x11938}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0},
    {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1},
    {0x1E030, 0x1E06D}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
    {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1F16C, 0x1F16C}, {0x1FBF0, 0x1FBF9},
};

bool newer_than_unicode9(char32_t cp) {
  const CodePointRange* end = std::end(kNewerThanUnicode9);
  const CodePointRange* it = std::upper_bound(
      std::begin(kNewerThanUnicode9), end, cp,
      [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != std::begin(kNewerThanUnicode9) && cp <= (it - 1)->last;
}

// True when NFC (as HF computes it) may change text holding `cp`
// (cp >= U+0300): it has a canonical decomposition, a non-zero combining
// class, or can be the second of a composition pair (utf8proc marks those with
// comb_index >= 0x8000; Hangul V/T jamo compose algorithmically).
bool nfc_sensitive(char32_t cp) {
  if (cp >= 0x1160 && cp <= 0x11FF) return true;
  if (newer_than_unicode9(cp)) return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  return p->combining_class != 0 || p->decomp_seqindex != UINT16_MAX ||
         (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000);
}

}  // namespace

void append_nfc(std::string_view s, std::string& out) {
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  LS_REQUIRE(n >= 0, ErrorKind::kInvalidArgument, "NFC normalization failed: {}",
             utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(dst, &std::free);
  out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

bool nfc(std::string_view s, std::string& out) {
  // NFC only changes runs of NFC-sensitive code points together with the
  // code point before them (a starter they may compose with); everything
  // else is copied. Code points below U+0300 (lead bytes below 0xCC) are not
  // sensitive, nor are those newer than Unicode 9.0, which also never join a
  // run (to HF they are starters that compose with nothing).
  size_t copied = 0;
  bool changed = false;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0xCC) {
      ++i;
      continue;
    }
    size_t start = i;
    if (!nfc_sensitive(next_code_point(s, i))) continue;
    if (start > copied) {  // include the previous code point
      size_t prev = start - 1;
      while (prev > copied && (static_cast<unsigned char>(s[prev]) & 0xC0) == 0x80) --prev;
      size_t j = prev;
      if (!newer_than_unicode9(next_code_point(s, j))) start = prev;
    }
    size_t end = i;
    while (end < s.size()) {
      size_t next = end;
      if (static_cast<unsigned char>(s[end]) < 0xCC || !nfc_sensitive(next_code_point(s, next))) break;
      end = next;
    }
    if (!changed) {
      out.clear();
      changed = true;
    }
    out.append(s.substr(copied, start - copied));
    append_nfc(s.substr(start, end - start), out);
    copied = end;
    i = end;
  }
  if (changed) out.append(s.substr(copied));
  return changed;
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols: circled and squared Latin letters.
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
      (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189)) {
    return true;
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    char32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t.byte_to_cp[b] = printable ? static_cast<char32_t>(b) : extra++;
      t.cp_to_byte[t.byte_to_cp[b]] = static_cast<uint8_t>(b);
    }
    return t;
  }();
  return table;
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  // Every byte-level char is below U+0144: a flat table (-1: not byte-level).
  static const std::array<int16_t, 0x144> reverse = [] {
    std::array<int16_t, 0x144> r;
    r.fill(-1);
    const ByteLevelTable& t = byte_level_table();
    for (int b = 0; b < 256; ++b) r[t.byte_to_cp[b]] = static_cast<int16_t>(b);
    return r;
  }();
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    char32_t cp = next_code_point(token, i);
    if (cp >= reverse.size() || reverse[cp] < 0) return std::nullopt;
    out.push_back(static_cast<char>(reverse[cp]));
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  const ByteLevelTable& t = byte_level_table();
  std::string out;
  for (char c : bytes) append_utf8(out, t.byte_to_cp[static_cast<unsigned char>(c)]);
  return out;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t at = 0;;) {
    const size_t next = s.find(from, at);
    out.append(s.substr(at, next - at));
    if (next == std::string_view::npos) return out;
    out.append(to);
    at = next + from.size();
  }
}

size_t leading_spaces(std::string_view s, size_t most) {
  size_t n = 0;
  while (n < s.size() && n < most && s[n] == ' ') ++n;
  return n;
}

}  // namespace lockstep::tok_detail
