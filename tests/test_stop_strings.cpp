// Stop strings over a stream of ids: the text ends before the earliest stop
// string, and streaming never hands out text that a stop string takes back.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/error.h"
#include "test_support.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {
namespace {

// ids 0..255 are the single bytes; 299 is the special <|end_of_text|>.
Tokenizer bytes_tokenizer() {
  return Tokenizer::load(std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "tests/data/tokenizer/fixtures/gen300.json");
}
constexpr int32_t kEndOfText = 299;

TEST(StopStrings, TextIsHeldBackWhileItCanStartAStopString) {
  const Tokenizer tok = bytes_tokenizer();
  StopStringStream s(tok, {"END", "xyz"});
  EXPECT_FALSE(s.push('a'));
  EXPECT_EQ(s.take_ready(), "a");
  EXPECT_FALSE(s.push('E'));
  EXPECT_EQ(s.take_ready(), "");  // "E" may start "END"
  EXPECT_FALSE(s.push('N'));
  EXPECT_EQ(s.take_ready(), "");
  EXPECT_FALSE(s.push('d'));
  EXPECT_EQ(s.take_ready(), "ENd");  // it did not
  EXPECT_FALSE(s.push('E'));
  EXPECT_FALSE(s.push('E'));  // the first E can no longer start END, the second can
  EXPECT_EQ(s.take_ready(), "E");
  EXPECT_FALSE(s.push('N'));
  EXPECT_TRUE(s.push('D'));
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.take_ready(), "");
  EXPECT_EQ(s.text(), "aENdE");
  EXPECT_TRUE(s.push('z'));  // ignored once stopped
  EXPECT_EQ(s.take_rest(), "");
  EXPECT_EQ(s.text(), "aENdE");
}

TEST(StopStrings, HeldBackTailComesOutAtTheEnd) {
  const Tokenizer tok = bytes_tokenizer();
  StopStringStream s(tok, {"xyz"});
  for (char c : std::string("axy")) EXPECT_FALSE(s.push(c));
  EXPECT_EQ(s.take_ready(), "a");
  EXPECT_EQ(s.take_rest(), "xy");
  EXPECT_FALSE(s.stopped());
  EXPECT_EQ(s.text(), "axy");
}

// Two stop strings completed by one piece (the second byte of é): the one
// that starts first ends the text, whatever their order.
TEST(StopStrings, EarliestOccurrenceWins) {
  const Tokenizer tok = bytes_tokenizer();
  for (const auto& stops : {std::vector<std::string>{"\xC3\xA9", "b\xC3\xA9"}, {"b\xC3\xA9", "\xC3\xA9"}}) {
    StopStringStream s(tok, stops);
    EXPECT_FALSE(s.push('a'));
    EXPECT_FALSE(s.push('b'));
    EXPECT_FALSE(s.push(0xC3));  // incomplete UTF-8: not text yet
    EXPECT_EQ(s.take_ready(), "a");
    EXPECT_TRUE(s.push(0xA9));
    EXPECT_EQ(s.take_rest(), "");
    EXPECT_EQ(s.text(), "a");
  }
}

// Special tokens are not text: a stop string does not match their content,
// and text on either side of one is matched as if it were not there.
TEST(StopStrings, SpecialTokensAreLeftOutOfTheText) {
  const Tokenizer tok = bytes_tokenizer();
  StopStringStream s(tok, {"<|end", "ab"});
  EXPECT_FALSE(s.push(kEndOfText));
  EXPECT_FALSE(s.push('a'));
  EXPECT_FALSE(s.push(kEndOfText));
  EXPECT_TRUE(s.push('b'));
  EXPECT_EQ(s.text(), "");
}

TEST(StopStrings, IncompleteUtf8AtTheEndBecomesAReplacementCharacter) {
  const Tokenizer tok = bytes_tokenizer();
  StopStringStream s(tok, {"zz"});
  EXPECT_FALSE(s.push('a'));
  EXPECT_FALSE(s.push(0xE4));
  EXPECT_EQ(s.take_ready(), "a");
  EXPECT_EQ(s.take_rest(), "\xEF\xBF\xBD");
}

TEST(StopStrings, EmptyOrInvalidStopStringsAreRefused) {
  const Tokenizer tok = bytes_tokenizer();
  expect_error([] { check_stop_strings({"a", ""}); }, ErrorKind::kInvalidArgument, {"stop string is empty"});
  expect_error([] { check_stop_strings({"\xC3"}); }, ErrorKind::kInvalidArgument, {"not valid UTF-8"});
  expect_error([&] { StopStringStream(tok, {""}); }, ErrorKind::kInvalidArgument, {"empty"});
  check_stop_strings({"ok", "\xC3\xA9"});
}

// Random streams of a few bytes (ASCII, the halves of é, a stray
// continuation byte) and the special token, against the whole text decoded
// afresh after every id: the stream stops at the first id whose text holds a
// stop string, its text is that text up to the earliest one, and what it
// hands out as it goes is always a prefix of its final text.
TEST(StopStrings, MatchesDecodingTheWholeTextAfterEveryId) {
  const Tokenizer tok = bytes_tokenizer();
  const std::vector<int32_t> alphabet = {'a', 'b', 'c', 0xC3, 0xA9, 0x80, kEndOfText};
  const std::vector<std::string> stops = {"abca", "bb", "c\xC3\xA9", "\xEF\xBF\xBD" "a"};
  std::mt19937 rng(11);
  int stopped_streams = 0;
  for (int trial = 0; trial < 300; ++trial) {
    StopStringStream s(tok, stops);
    std::vector<int32_t> ids;
    std::string shown, expected;
    bool stopped = false;
    for (int i = 0; i < 30 && !stopped; ++i) {
      ids.push_back(alphabet[rng() % alphabet.size()]);
      stopped = s.push(ids.back());
      shown += s.take_ready();
      StreamDecoder whole(tok);
      expected.clear();
      for (int32_t id : ids)
        if (!tok.is_special(id)) expected += whole.push(id);
      size_t earliest = std::string::npos;
      for (const std::string& stop : stops) earliest = std::min(earliest, expected.find(stop));
      ASSERT_EQ(stopped, earliest != std::string::npos) << "trial " << trial << " id " << i;
      if (stopped) expected.resize(earliest);
    }
    shown += s.take_rest();
    if (!stopped) {
      StreamDecoder whole(tok);
      expected.clear();
      for (int32_t id : ids)
        if (!tok.is_special(id)) expected += whole.push(id);
      expected += whole.flush();
    }
    EXPECT_EQ(s.text(), expected) << "trial " << trial;
    EXPECT_EQ(shown, expected) << "trial " << trial;
    stopped_streams += stopped;
  }
  EXPECT_GT(stopped_streams, 100);
  EXPECT_LT(stopped_streams, 300);
}

}  // namespace
}  // namespace lockstep
