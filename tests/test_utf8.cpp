// common/utf8.h: the one UTF-8 check (safetensors headers, tokenizer input,
// stop strings), the escaping of error lines and the repair of invalid bytes
// in generated text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace lockstep {
namespace {

using namespace std::string_literals;

TEST(Utf8, FindsTheFirstInvalidByte) {
  constexpr size_t kValid = std::string_view::npos;
  EXPECT_EQ(find_invalid_utf8(""), kValid);
  EXPECT_EQ(find_invalid_utf8("plain ascii"), kValid);
  EXPECT_EQ(find_invalid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), kValid);  // é € 😀
  EXPECT_EQ(find_invalid_utf8("\xf4\x8f\xbf\xbf"), kValid);                          // U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\xc0\xaf"), 1u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xe0\x80\xaf"), 0u);        // overlong, three bytes
  EXPECT_EQ(find_invalid_utf8("x\xed\xa0\x80"), 1u);       // a surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);    // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("ok\xe2\x82"), 2u);          // cut short
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);                // a lone continuation byte
  EXPECT_EQ(find_invalid_utf8("a\0b"s), kValid);           // NUL is valid UTF-8
}

TEST(Utf8, PrintableEscapesBadBytesAndControls) {
  EXPECT_EQ(printable("caf\xc3\xa9 ok"), "caf\xc3\xa9 ok");
  EXPECT_EQ(printable("a\xff" "b"), "a\\xffb");
  EXPECT_EQ(printable("line\nnext\r\t\x1b[31m"), "line\\x0anext\\x0d\\x09\\x1b[31m");
  EXPECT_EQ(printable("\x7f"), "\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "2J"), "\\xc2\\x9b2J");  // U+009B, a C1 control (CSI)
  EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");            // U+00A0 is printable
  EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");          // cut short: each byte escaped
  EXPECT_EQ(printable("a\0b"s), "a\\x00b");
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

// Repairs all of `bytes` as a whole text: what can be decided, then the tail.
std::string repair_all(std::string bytes, Utf8Repair repair) {
  std::string out = take_complete_utf8(bytes, repair);
  return out + repair_truncated_utf8(bytes, repair);
}

const std::string kFffd = "\xEF\xBF\xBD";

// 5212 byte strings and what Python's bytes.decode("utf-8", "replace") makes
// of them (tests/oracle/utf8_repair_refs.py): one U+FFFD per maximal subpart,
// as Rust's from_utf8_lossy in Hugging Face's ByteLevel decoder. Exact.
TEST(Utf8, MaximalSubpartsAsPython) {
  const auto path = std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "tests/data/tokenizer/refs/utf8_repair.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json rows = nlohmann::json::parse(in);
  ASSERT_GT(rows.size(), 5000u);
  for (const auto& row : rows) {
    const std::string bytes = from_hex(row[0].get<std::string>());
    EXPECT_EQ(repair_all(bytes, Utf8Repair::kMaximalSubpart), from_hex(row[1].get<std::string>()))
        << "bytes " << row[0];
  }
}

TEST(Utf8, TakesWhatCanBeDecided) {
  std::string bytes = "ab\xE4\xB8";  // 中 cut short: held
  EXPECT_EQ(take_complete_utf8(bytes, Utf8Repair::kMaximalSubpart), "ab");
  EXPECT_EQ(bytes, "\xE4\xB8");
  bytes += "\xAD";
  EXPECT_EQ(take_complete_utf8(bytes, Utf8Repair::kMaximalSubpart), "\xE4\xB8\xAD");
  EXPECT_TRUE(bytes.empty());
  // E0 80 can never be valid (overlong): decided at once, not held.
  bytes = "\xE0\x80";
  EXPECT_EQ(take_complete_utf8(bytes, Utf8Repair::kMaximalSubpart), kFffd + kFffd);
  EXPECT_TRUE(bytes.empty());
  bytes = "x\xF0\x9F\x98";  // a cut-off emoji at the end: one U+FFFD when the text ends
  EXPECT_EQ(take_complete_utf8(bytes, Utf8Repair::kMaximalSubpart), "x");
  EXPECT_EQ(repair_truncated_utf8(bytes, Utf8Repair::kMaximalSubpart), kFffd);
}

// One U+FFFD per byte, as Hugging Face's ByteFallback decoder puts for a run
// of byte tokens that is not valid UTF-8. (That decoder replaces every byte
// of such a run, valid characters in it included: <0xE4><0x41> is two there
// and U+FFFD + "A" here. The text streams; holding every byte token back
// until its run ends would delay each newline of a Llama 2 or Mistral reply.)
TEST(Utf8, EachByteAsByteFallback) {
  EXPECT_EQ(repair_all("\xE4\xB8" "a", Utf8Repair::kEachByte), kFffd + kFffd + "a");
  EXPECT_EQ(repair_all("\xF0\x9F\x98", Utf8Repair::kEachByte), kFffd + kFffd + kFffd);
  EXPECT_EQ(repair_all("\xFF\x80", Utf8Repair::kEachByte), kFffd + kFffd);
  EXPECT_EQ(repair_all("\xC3\xA9\n", Utf8Repair::kEachByte), "\xC3\xA9\n");
  // The same bytes by maximal subparts.
  EXPECT_EQ(repair_all("\xE4\xB8" "a", Utf8Repair::kMaximalSubpart), kFffd + "a");
  EXPECT_EQ(repair_all("\xF0\x9F\x98", Utf8Repair::kMaximalSubpart), kFffd);
}

}  // namespace
}  // namespace lockstep
