// The golden models of tests/data/golden (tests/oracle/make_golden.py):
// where they are and how their logits are compared. Shared by the CPU golden
// test and the GPU one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/io/npy.h"

namespace lockstep::golden {

namespace fs = std::filesystem;

inline fs::path golden_root() { return fs::path(LOCKSTEP_SOURCE_DIR) / "tests" / "data" / "golden"; }

inline std::vector<std::string> golden_cases() {
  std::vector<std::string> names;
  if (fs::is_directory(golden_root()))
    for (const auto& e : fs::directory_iterator(golden_root()))
      if (fs::exists(e.path() / "case.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline double stddev(const NpyArray& a) {
  double s = 0, sq = 0, n = static_cast<double>(a.values.size());
  for (double v : a.values) s += v, sq += v * v;
  return std::sqrt(sq / n - (s / n) * (s / n));
}

inline double max_abs_diff(const NpyArray& a, const NpyArray& b) {
  EXPECT_EQ(a.shape, b.shape);
  double m = 0;
  for (size_t i = 0; i < std::min(a.values.size(), b.values.size()); ++i)
    m = std::max(m, std::abs(a.values[i] - b.values[i]));
  return m;
}

}  // namespace lockstep::golden
