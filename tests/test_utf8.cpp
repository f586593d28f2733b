// common/utf8.h: the one UTF-8 check (safetensors headers, tokenizer input,
// stop strings) and the escaping of error lines.
#include <gtest/gtest.h>

#include <string>
#include <string_view>

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

}  // namespace
}  // namespace lockstep
