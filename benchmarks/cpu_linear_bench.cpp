// The CPU backend's product (cpu::linear) on the threads OpenMP gives it
// (OMP_NUM_THREADS).
//
//   cpu_linear_bench [IN_FEATURES OUT_FEATURES [ROWS,ROWS,... [DTYPE]]]
//
// Defaults: 2048 x 2048 at rows 1,2,8,32,128, bf16 weights (DTYPE: bf16,
// f16 or f32). Prints the median of the runs
// that fit in ~0.5 s per row count (at least 5), in ms and GFLOP/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/linear.h"

namespace {

using Clock = std::chrono::steady_clock;

std::vector<int64_t> parse_rows(const char* list) {
  std::vector<int64_t> rows;
  std::stringstream s(list);
  for (std::string item; std::getline(s, item, ',');) rows.push_back(std::max<int64_t>(1, std::atoll(item.c_str())));
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep;
  const int64_t in = argc > 2 ? std::atoll(argv[1]) : 2048, out = argc > 2 ? std::atoll(argv[2]) : 2048;
  const std::vector<int64_t> rows_list = parse_rows(argc > 3 ? argv[3] : "1,2,8,32,128");
  if (in < 1 || out < 1) {
    std::fprintf(stderr, "usage: %s [IN_FEATURES OUT_FEATURES] [ROWS,ROWS,...]\n", argv[0]);
    return 2;
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> w32(static_cast<size_t>(in * out));
  for (float& v : w32) v = uniform(rng);
  const DType dtype = argc > 4 ? parse_dtype_name(argv[4]) : DType::kBF16;
  std::vector<uint16_t> w16(dtype == DType::kF32 ? 0 : w32.size());
  if (dtype != DType::kF32) convert_from_f32(w32.data(), w16.data(), dtype, w16.size());
  const void* w = dtype == DType::kF32 ? static_cast<const void*>(w32.data()) : w16.data();
  std::printf("%s weights %lld x %lld\n", dtype_name(dtype), static_cast<long long>(out), static_cast<long long>(in));
  for (int64_t rows : rows_list) {
    std::vector<float> x(static_cast<size_t>(rows * in)), y(static_cast<size_t>(rows * out));
    for (float& v : x) v = uniform(rng);
    const LinearParams p{.x = x.data(), .weight = w, .y = y.data(), .rows = rows, .in_features = in,
                         .out_features = out, .weight_dtype = dtype};
    cpu::linear(p);  // warm-up: the weights' pages and the threads
    std::vector<double> ms;
    const Clock::time_point start = Clock::now();
    while (ms.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < 0.5) {
      const Clock::time_point t0 = Clock::now();
      cpu::linear(p);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    const double median = ms[ms.size() / 2];
    std::printf("rows %4lld  %9.3f ms  %7.1f GFLOP/s\n", static_cast<long long>(rows), median,
                2.0 * rows * in * out / (median * 1e6));
  }
  return 0;
}
