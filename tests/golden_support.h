// The golden models of tests/data/golden (tests/oracle/make_golden.py):
// where they are and how their logits are compared. Shared by the CPU golden
// test and the GPU one.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

// Row `r` of a [rows, cols] array.
inline std::vector<double> row(const NpyArray& a, size_t r) {
  const size_t cols = a.shape.at(1);
  return {a.values.begin() + static_cast<std::ptrdiff_t>(r * cols),
          a.values.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols)};
}

inline double top2_margin(std::vector<double> v) {
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<>());
  return v[0] - v[1];
}

// The fraction of the logits' std allowed on the GPU for the dtype it
// computes in (the reasons are in tests/cuda/test_cuda_golden.cpp):
// float32 1e-3, f16 checkpoints 0.03, bf16 (and float32 checkpoints run in
// bf16) 0.1.
inline double gpu_tolerance_fraction(bool float32, const std::string& checkpoint_dtype) {
  if (float32) return 1e-3;
  return checkpoint_dtype == "torch.float16" ? 0.03 : 0.1;
}

}  // namespace lockstep::golden
