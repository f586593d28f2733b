// The CUDA sample op against its CPU twin: the same ids, exactly, for every
// dtype (the CPU sees the GPU's rounded inputs), odd sizes with vocabulary
// padding, ties, infinities and NaNs, tiny and large temperatures, and the
// sharded layout of gathered TP logits.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "kernels/cuda/ops.h"
#include "tests/cuda/cuda_test_support.h"

namespace lockstep {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Per row, a mix of settings: greedy, tiny to large temperatures, top-k
// from 1 to past the row, top-p from tiny to 1.
std::vector<SampleRow> mixed_settings(int64_t rows, std::mt19937_64& rng) {
  const float temperatures[] = {0.0f, 1e-3f, 0.7f, 1.0f, 50.0f, 1e4f};
  const int32_t top_ks[] = {0, 1, 7, 50, 1 << 20};
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 1e-3f};
  std::vector<SampleRow> s;
  for (int64_t r = 0; r < rows; ++r)
    s.push_back(SampleRow{.random = rng(),
                          .temperature = temperatures[rng() % 6],
                          .top_p = top_ps[rng() % 4],
                          .top_k = top_ks[rng() % 5]});
  return s;
}

// Runs the op on the GPU (logits already rounded to dt) and the CPU twin on
// the same values; expects the same ids.
void expect_same_ids(cudaStream_t stream, const std::vector<float>& logits, DType dt,
                     const std::vector<SampleRow>& settings, SampleParams shape, const std::string& what) {
  std::vector<int32_t> settings_raw(settings.size() * sizeof(SampleRow) / 4);
  std::memcpy(settings_raw.data(), settings.data(), settings.size() * sizeof(SampleRow));
  DeviceArray d_logits(logits, dt), d_settings(settings_raw), d_ids(shape.rows, DType::kF32);
  SampleParams p = shape;
  p.logits = d_logits.get(), p.settings = reinterpret_cast<const SampleRow*>(d_settings.get()), p.ids = d_ids.ints();
  p.dtype = dt;
  cuda::sample(p, stream);
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<int32_t> got(static_cast<size_t>(shape.rows)), want(static_cast<size_t>(shape.rows));
  LS_CHECK_CUDA(cudaMemcpy(got.data(), d_ids.get(), got.size() * 4, cudaMemcpyDeviceToHost));
  SampleParams c = shape;
  c.logits = logits.data(), c.settings = settings.data(), c.ids = want.data(), c.dtype = DType::kF32;
  cpu::sample(c);
  EXPECT_EQ(got, want) << what << " " << dtype_name(dt);
}

std::string label(int64_t rows, int64_t cols) { return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols); }

// One test per dtype, so that compute-sanitizer can run them side by side.
void odd_sizes(cudaStream_t stream, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::mt19937_64 bits(seed + 1);
  for (int64_t rows : {1, 7, 19})
    for (int64_t cols : {1, 7, 989, 32000, 128256}) {
      std::vector<float> logits = random_values(rows * cols, dt, rng, 3.0f);
      const int64_t valid = cols > 3 ? cols - 3 : cols;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = valid; c < cols; ++c) logits[static_cast<size_t>(r * cols + c)] = 100.0f;  // padding
      expect_same_ids(stream, logits, dt, mixed_settings(rows, bits),
                      SampleParams{.rows = rows, .cols = cols, .valid_cols = valid}, label(rows, cols));
    }
}

TEST_F(CudaOpTest, SampleMatchesCpuOnOddSizesF32) { odd_sizes(stream_, DType::kF32, 11); }
TEST_F(CudaOpTest, SampleMatchesCpuOnOddSizesBf16) { odd_sizes(stream_, DType::kBF16, 111); }
TEST_F(CudaOpTest, SampleMatchesCpuOnOddSizesF16) { odd_sizes(stream_, DType::kF16, 211); }

// Coarse logits (many equal keys at every cut), and rows of infinities and
// NaNs; one test per dtype, as above.
void ties_and_infinities(cudaStream_t stream, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::mt19937_64 bits(seed + 1);
  for (int64_t cols : {7, 989, 32000}) {
    const int64_t rows = 19;
    std::vector<float> logits = random_values(rows * cols, dt, rng, 2.0f);
    for (float& x : logits) x = std::round(x * 2.0f) / 2.0f;  // halves: exact in every dtype
    auto row = [&](int64_t r) { return logits.begin() + r * cols; };
    std::fill(row(0), row(1), -kInf);
    row(0)[cols / 2] = 1.0f;  // one finite logit among -inf
    std::fill(row(1), row(2), -kInf);  // all -inf: no token (-1)
    row(2)[1] = row(2)[cols - 1] = kInf;  // two +inf
    for (int64_t c = 0; c < cols; c += 3) row(3)[c] = std::numeric_limits<float>::quiet_NaN();
    std::fill(row(4), row(5), 0.25f);  // one value everywhere
    std::fill(row(5), row(6), std::numeric_limits<float>::quiet_NaN());  // all NaN: no token (-1)
    for (int repeat = 0; repeat < 4; ++repeat)
      expect_same_ids(stream, logits, dt, mixed_settings(rows, bits),
                      SampleParams{.rows = rows, .cols = cols, .valid_cols = cols}, "ties " + label(rows, cols));
  }
}

TEST_F(CudaOpTest, SampleMatchesCpuOnTiesAndInfinitiesF32) { ties_and_infinities(stream_, DType::kF32, 13); }
TEST_F(CudaOpTest, SampleMatchesCpuOnTiesAndInfinitiesBf16) { ties_and_infinities(stream_, DType::kBF16, 113); }
TEST_F(CudaOpTest, SampleMatchesCpuOnTiesAndInfinitiesF16) { ties_and_infinities(stream_, DType::kF16, 213); }

// The all-gathered TP layout: [shards][rows][cols], padding at the end.
TEST_F(CudaOpTest, SampleMatchesCpuOnShardedRows) {
  std::mt19937 rng(15);
  std::mt19937_64 bits(16);
  for (DType dt : all_dtypes())
    for (int64_t shards : {2, 4, 8}) {
      const int64_t rows = 7, vocab = 32001, cols = (vocab + shards - 1) / shards;
      const std::vector<float> logits = random_values(shards * rows * cols, dt, rng, 3.0f);
      expect_same_ids(stream_, logits, dt, mixed_settings(rows, bits),
                      SampleParams{.rows = rows, .cols = cols, .shards = shards, .valid_cols = vocab},
                      "shards=" + std::to_string(shards));
    }
}

}  // namespace
}  // namespace lockstep
