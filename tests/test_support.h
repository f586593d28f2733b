// Helpers shared by the tests: a per-test scratch folder and a check that an
// action throws a lockstep::Error of a given kind whose one-line message
// contains given words.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>

#include "common/error.h"

namespace lockstep {

// Where scripts/fetch_tokenizers.sh put the real tokenizer files
// (<dir>/<name>/tokenizer.json and tokenizer_config.json): $LOCKSTEP_TOKENIZER_DIR,
// else build/tokenizers in the source tree.
inline std::filesystem::path real_tokenizer_dir() {
  const char* env = std::getenv("LOCKSTEP_TOKENIZER_DIR");
  if (env != nullptr && *env != '\0') return env;
  return std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "build" / "tokenizers";
}

// The running test's full name as one path component: parameterized suites
// and tests have '/' in their names ("Cases/Golden", "Score/llama"), which
// would otherwise nest directories that TearDown leaves behind.
inline std::string test_name_for_path() {
  const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(test->test_suite_name()) + "_" + test->name();
  std::replace(name.begin(), name.end(), '/', '_');
  return name;
}

// Creates temp_directory_path()/lockstep_test_<pid>_<test name> in SetUp and
// removes it in TearDown.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("lockstep_test_" + std::to_string(::getpid()) + "_" + test_name_for_path());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
};

template <typename Action>
void expect_error(Action&& action, ErrorKind kind, std::initializer_list<std::string> words) {
  try {
    action();
    ADD_FAILURE() << "expected a lockstep::Error of kind " << error_kind_name(kind);
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(e.kind(), kind) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "message is not one line: " << message;
    for (const std::string& word : words) {
      EXPECT_NE(message.find(word), std::string::npos)
          << "'" << word << "' missing from: " << message;
    }
  }
}

}  // namespace lockstep
