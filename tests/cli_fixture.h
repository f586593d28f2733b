// The fixture of the tests that run the lockstep executable on a tiny
// random model (test_cli.cpp, test_cli_stop.cpp).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_support.h"
#include "test_support.h"

namespace lockstep::testing_cli {

class Cli : public TempDirTest {
 protected:
  std::filesystem::path make_model(const std::string& name, const std::string& extra = "") {
    auto dir = dir_ / name;
    CommandResult r = run(lockstep("make-model --arch llama --preset tiny --out " + dir.string() + " " + extra),
                          dir_ / ("make_" + name));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return dir;
  }
  // Expects failure with exactly one error line containing every word, and no crash.
  void expect_clean_failure(const CommandResult& r, std::initializer_list<std::string> words) {
    EXPECT_NE(r.exit_code, 0) << r.err;
    EXPECT_LT(r.exit_code, 128) << "killed by a signal: " << r.err;
    std::smatch m;
    std::regex error_line(R"(\[error\] ([^\n]*))");
    ASSERT_TRUE(std::regex_search(r.err, m, error_line)) << r.err;
    for (const auto& w : words) EXPECT_NE(m[1].str().find(w), std::string::npos) << w << " missing in: " << m[1];
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }
  CommandResult generate(const std::filesystem::path& model, const std::string& args) {
    return run(lockstep("generate --backend cpu --model " + model.string() + " " + args), dir_ / "run");
  }
  void rewrite_config(const std::filesystem::path& model, const std::function<void(nlohmann::json&)>& edit) {
    auto path = model / "config.json";
    nlohmann::json j = nlohmann::json::parse(read_file(path));
    edit(j);
    std::ofstream(path) << j.dump();
  }
};

}  // namespace lockstep::testing_cli
