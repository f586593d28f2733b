// The CPU backend: float32 activations and arithmetic, ops from kernels/cpu;
// the products' weights may stay in the checkpoint's 16-bit type (widened to
// float32 as the products read them: the same values, half the bytes).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/error.h"
#include "engine/backend.h"

namespace lockstep {

Buffer Backend::upload(const std::vector<float>& host, DType dtype) {
  int64_t bytes = static_cast<int64_t>(host.size() * dtype_size(dtype));
  Buffer buf = alloc(bytes);
  if (dtype == DType::kF32) {
    to_backend(buf.data(), host.data(), bytes);
  } else {
    std::vector<uint8_t> converted(static_cast<size_t>(bytes));
    convert_from_f32(host.data(), converted.data(), dtype, host.size());
    to_backend(buf.data(), converted.data(), bytes);
  }
  return buf;
}

int64_t Backend::default_kv_cache_bytes(int sharing) const {
  const int64_t phys = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return phys / 4 / std::max(1, sharing);
}

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType weights) : weights_(weights) {}
  std::string name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return weights_; }
  bool host_memory() const override { return true; }

  Buffer alloc(int64_t bytes) override {
    size_t size = static_cast<size_t>(bytes > 0 ? bytes : 1);
    size = (size + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, size);
    LS_REQUIRE(p != nullptr, ErrorKind::kInvalidArgument, "out of host memory allocating {} bytes", bytes);
    return Buffer(p, bytes, [](void* q) { std::free(q); });
  }
  void to_backend(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void to_host(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void copy_within(void* dst, const void* src, int64_t bytes) override {
    std::memmove(dst, src, static_cast<size_t>(bytes));
  }
  Buffer alloc_host_visible(int64_t bytes) override {
    Buffer b = alloc(bytes);
    std::memset(b.data(), 0, static_cast<size_t>(bytes));
    return b;
  }
  void synchronize() override {}

  void embedding(const EmbeddingParams& p) override { cpu::embedding(p); }
  void linear(const LinearParams& p) override { cpu::linear(p); }
  void attention(const AttentionParams& p) override { cpu::attention(p); }
  void argmax(const ArgmaxParams& p) override { cpu::argmax(p); }
  void sample(const SampleParams& p) override { cpu::sample(p); }
  void next_tokens(const NextTokensParams& p) override { cpu::next_tokens(p); }

 private:
  DType weights_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(DType weights) { return std::make_unique<CpuBackend>(weights); }

}  // namespace lockstep
