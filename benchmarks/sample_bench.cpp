// The sample op alone (kernels/cuda/sampling.cu) on a llama3 vocabulary
// (128256 columns of bf16 logits), 1-64 rows, timed inside a CUDA graph as
// the decode step runs it. Three logit shapes:
//   flat: normal, std 1 (a random-weight model's logits): at temperature
//     0.7 every column weighs something, the worst case for the passes that
//     compute weights;
//   peaked: normal, std 3, plus one column 12 above the rest per row: still
//     most columns within 23 temperatures of the top, so most weigh
//     something;
//   sharp: normal, std 2, plus one column 30 above the rest (a confident
//     trained model): every other column weighs nothing.
// Settings: greedy; temperature 0.7 with top-p 0.9 (`bench`'s sampled run);
// temperature 1 with nothing cut; temperature 0.7 with top-k 50 and top-p 0.9.
// Run: build/sample_bench [iterations [shape setting rows]]; the three
// names pick one configuration (e.g. for ncu: `sample_bench 1 flat t0.7,p0.9 1`).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "common/dtype.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

namespace {

using lockstep::DType;
using lockstep::SampleRow;

constexpr int64_t kVocab = 128256;
constexpr int64_t kMaxRows = 64;

struct Setting {
  const char* name;
  SampleRow row;
};

const Setting kSettings[] = {{"greedy", SampleRow{}},
                             {"t0.7,p0.9", SampleRow{.temperature = 0.7f, .top_p = 0.9f}},
                             {"t1", SampleRow{.temperature = 1.0f}},
                             {"t0.7,k50,p0.9", SampleRow{.temperature = 0.7f, .top_p = 0.9f, .top_k = 50}}};

struct Shape {
  const char* name;
  float std, top;  // the logits' spread, and how far one column per row sits above it
};

const Shape kShapes[] = {{"flat", 1.0f, 0.0f}, {"peaked", 3.0f, 12.0f}, {"sharp", 2.0f, 30.0f}};

void* device_logits(const Shape& shape, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, shape.std);
  std::vector<float> host(static_cast<size_t>(kMaxRows * kVocab));
  for (float& v : host) v = dist(rng);
  for (int64_t r = 0; r < kMaxRows; ++r) host[static_cast<size_t>(r * kVocab + (r * 7919) % kVocab)] += shape.top;
  return lockstep::bench::upload_bf16(host);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const bool one = argc > 4;
  const std::string only_shape = one ? argv[2] : "", only_setting = one ? argv[3] : "";
  const int64_t only_rows = one ? std::atoll(argv[4]) : 0;
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::mt19937 rng(7);
  std::mt19937_64 bits(8);
  SampleRow* settings = nullptr;
  int32_t* ids = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&settings, kMaxRows * sizeof(SampleRow)));
  LS_CHECK_CUDA(cudaMalloc(&ids, kMaxRows * sizeof(int32_t)));
  std::printf("%-7s %-14s %5s %10s\n", "logits", "setting", "rows", "us");
  for (const Shape& shape : kShapes) {
    if (one && only_shape != shape.name) continue;
    void* logits = device_logits(shape, rng);
    for (const Setting& s : kSettings) {
      if (one && only_setting != s.name) continue;
      std::vector<SampleRow> host(kMaxRows, s.row);
      for (SampleRow& r : host) r.random = bits();
      LS_CHECK_CUDA(cudaMemcpy(settings, host.data(), host.size() * sizeof(SampleRow), cudaMemcpyHostToDevice));
      for (int64_t rows : {1, 8, 32, 64}) {
        if (one && rows != only_rows) continue;
        const lockstep::SampleParams p{.logits = logits, .settings = settings, .ids = ids, .rows = rows,
                                       .cols = kVocab, .valid_cols = kVocab, .dtype = DType::kBF16};
        const double us = lockstep::bench::graphed_us(stream, 4, iters, [&](int) { lockstep::cuda::sample(p, stream); });
        std::printf("%-7s %-14s %5lld %10.1f\n", shape.name, s.name, static_cast<long long>(rows), us);
      }
    }
    LS_CHECK_CUDA(cudaFree(logits));
  }
  return 0;
}
