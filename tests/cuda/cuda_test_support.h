// Shared by the GPU op tests: a fixture that skips without a GPU, device
// buffers filled from float32 host data in any dtype, random inputs rounded
// to the dtype under test (so the CPU reference sees exactly the GPU's
// inputs), and the comparison against the float32 CPU reference.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "engine/backend.h"
#include "kernels/cuda/check.h"

namespace lockstep {

class CudaOpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    LS_CHECK_CUDA(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void sync() { LS_CHECK_CUDA(cudaStreamSynchronize(stream_)); }
  cudaStream_t stream_ = nullptr;
};

// Device memory holding `count` elements of `dtype`.
class DeviceArray {
 public:
  DeviceArray(int64_t count, DType dtype) : count_(count), dtype_(dtype) {
    LS_CHECK_CUDA(cudaMalloc(&ptr_, static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_size(dtype)));
    // Poison: 0xff bytes are NaN in every float type, so unwritten outputs fail.
    LS_CHECK_CUDA(cudaMemset(ptr_, 0xff, static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_size(dtype)));
  }
  DeviceArray(const std::vector<float>& host, DType dtype) : DeviceArray(static_cast<int64_t>(host.size()), dtype) {
    upload(host);
  }
  DeviceArray(const std::vector<int32_t>& host) : count_(static_cast<int64_t>(host.size())), dtype_(DType::kF32) {
    LS_CHECK_CUDA(cudaMalloc(&ptr_, host.size() * 4 + 4));
    LS_CHECK_CUDA(cudaMemcpy(ptr_, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void upload(const std::vector<float>& host) {
    std::vector<uint8_t> raw(host.size() * dtype_size(dtype_));
    convert_from_f32(host.data(), raw.data(), dtype_, host.size());
    LS_CHECK_CUDA(cudaMemcpy(ptr_, raw.data(), raw.size(), cudaMemcpyHostToDevice));
  }
  std::vector<float> download() const {
    std::vector<uint8_t> raw(static_cast<size_t>(count_) * dtype_size(dtype_));
    LS_CHECK_CUDA(cudaMemcpy(raw.data(), ptr_, raw.size(), cudaMemcpyDeviceToHost));
    std::vector<float> out(static_cast<size_t>(count_));
    convert_to_f32(raw.data(), dtype_, out.data(), out.size());
    return out;
  }
  void* get() const { return ptr_; }
  int32_t* ints() const { return static_cast<int32_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  int64_t count_ = 0;
  DType dtype_;
};

// `v` rounded to `dtype` and back.
inline std::vector<float> rounded_to(DType dtype, std::vector<float> v) {
  std::vector<uint8_t> raw(v.size() * dtype_size(dtype));
  convert_from_f32(v.data(), raw.data(), dtype, v.size());
  convert_to_f32(raw.data(), dtype, v.data(), v.size());
  return v;
}

// Normal(0, scale) values, rounded to `dtype` and back.
inline std::vector<float> random_values(int64_t n, DType dtype, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return rounded_to(dtype, std::move(v));
}

// Uniform values of mean 0 and standard deviation `scale`, rounded to
// `dtype` and back, from a splitmix64 stream seeded by `rng`: for the KV
// caches' earlier context (~34 M values in the largest attention cases),
// where mt19937's normal distribution took most of a test's host time. The
// values need only be random; results are compared where they are read.
inline std::vector<float> random_cache_values(int64_t n, DType dtype, std::mt19937& rng, float scale = 1.0f) {
  uint64_t state = (static_cast<uint64_t>(rng()) << 32) | rng();
  const float half_width = std::sqrt(3.0f) * scale;  // uniform on [-w, w]: standard deviation w / sqrt(3)
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    uint64_t z = state += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    x = (static_cast<float>(z >> 40) * 0x1p-23f - 1.0f) * half_width;  // 24 random bits onto [-1, 1)
  }
  return rounded_to(dtype, std::move(v));
}

// Tolerances, relative to the reference's largest magnitude, for results
// that go through one final rounding to the dtype plus float32 arithmetic
// in a different order than the CPU: float32 a few ulps of the sums (1e-5),
// bf16 one rounding is 2^-9 relative, ~4e-3 at the largest element, and
// inputs rounded in the chain (the residual sum) add one more; f16 is 8x
// finer than bf16.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 2e-5;
    case DType::kBF16: return 1.6e-2;
    case DType::kF16: return 2e-3;
  }
  return 0.0;
}

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, DType dtype,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= worst)) {  // NaN compares false: a NaN becomes the worst
      worst = std::isnan(err) ? INFINITY : err;
      worst_at = i;
    }
  }
  EXPECT_LE(worst / scale, tolerance(dtype))
      << what << " " << dtype_name(dtype) << ": worst at " << worst_at << " got " << got[worst_at] << " want "
      << want[worst_at] << " (scale " << scale << ")";
}

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> d{DType::kF32, DType::kBF16, DType::kF16};
  return d;
}

inline const std::vector<int64_t>& odd_rows() {
  static const std::vector<int64_t> r{1, 7, 19, 111, 989};
  return r;
}

}  // namespace lockstep
