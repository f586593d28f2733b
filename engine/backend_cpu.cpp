// The CPU backend: float32 activations and arithmetic, ops from kernels/cpu;
// the products' weights may stay in the checkpoint's 16-bit type (widened to
// float32 as the products read them: the same values, half the bytes).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <vector>

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
  return std::min(phys / 4, free_memory_bytes()) / std::max(1, sharing);
}

namespace {

// A number of bytes read from the first line of a cgroup file; nullopt for
// "max" (no limit) or a file that is not there.
std::optional<int64_t> cgroup_bytes(const std::string& path) {
  std::ifstream in(path);
  int64_t v = 0;
  if (!(in >> v)) return std::nullopt;
  return v;
}

// The memory this process's cgroup (v2) may still take, if it has a limit.
std::optional<int64_t> cgroup_headroom() {
  std::ifstream self("/proc/self/cgroup");
  std::string line;
  while (std::getline(self, line)) {
    if (!line.starts_with("0::")) continue;
    const std::string dir = "/sys/fs/cgroup" + line.substr(3);
    const auto limit = cgroup_bytes(dir + "/memory.max");
    const auto used = cgroup_bytes(dir + "/memory.current");
    if (limit && used) return std::max<int64_t>(*limit - *used, 0);
  }
  return std::nullopt;
}

}  // namespace

int64_t Backend::free_memory_bytes() const {
  int64_t available = static_cast<int64_t>(sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    int64_t kib = 0;
    if (key == "MemAvailable:" && meminfo >> kib) {
      available = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (const auto headroom = cgroup_headroom()) available = std::min(available, *headroom);
  return available;
}

namespace {

// Copies of at least this many bytes are split over the ops' threads, in
// chunks of kCopyChunk (one thread alone does not reach the host's bandwidth).
constexpr int64_t kParallelCopyBytes = int64_t{1} << 20;
constexpr int64_t kCopyChunk = int64_t{256} << 10;
constexpr size_t kHugePage = size_t{2} << 20;  // x86-64's and Arm64's usual transparent huge page

// fn(offset, length) over [0, bytes) in kCopyChunk pieces, on the threads.
template <typename Fn>
void for_chunks(int64_t bytes, Fn fn) {
  const int64_t chunks = (bytes + kCopyChunk - 1) / kCopyChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    fn(c * kCopyChunk, static_cast<size_t>(std::min(kCopyChunk, bytes - c * kCopyChunk)));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(DType weights) : weights_(weights) {}
  std::string name() const override { return "cpu"; }
  DType act_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return weights_; }
  bool host_memory() const override { return true; }
  bool kv_cache_head_major() const override { return true; }

  Buffer alloc(int64_t bytes) override { return aligned(bytes, 64); }
  // Weights of a huge page or more start on a huge page's boundary, and their
  // whole huge pages ask to be transparent huge pages (which Debian's default,
  // "madvise", gives only on request; a ragged end keeps 4 KB pages): a step
  // streams them with far fewer TLB misses. Not the KV cache: it fills a
  // position at a time, and 2 MiB pages would take each sequence's memory
  // 2 MiB at a time per layer.
  Buffer alloc_weights(int64_t bytes) override {
    Buffer b = aligned(bytes, bytes >= static_cast<int64_t>(kHugePage) ? kHugePage : 64);
#ifdef MADV_HUGEPAGE
    if (bytes >= static_cast<int64_t>(kHugePage))
      madvise(b.data(), static_cast<size_t>(bytes) / kHugePage * kHugePage, MADV_HUGEPAGE);  // advice: may be refused
#endif
    return b;
  }
  void to_backend(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void to_host(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
  }
  void copy_within(void* dst, const void* src, int64_t bytes) override {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    if (bytes < kParallelCopyBytes || (d < s + bytes && s < d + bytes)) {
      std::memmove(dst, src, static_cast<size_t>(bytes));
      return;
    }
    for_chunks(bytes, [&](int64_t at, size_t n) { std::memcpy(d + at, s + at, n); });
  }
  Buffer alloc_host_visible(int64_t bytes) override {
    Buffer b = alloc(bytes);
    std::memset(b.data(), 0, static_cast<size_t>(bytes));
    return b;
  }
  void synchronize() override {}

  double copy_bandwidth_gbs(int64_t bytes) override {
    Buffer a = alloc(bytes), b = alloc(bytes);
    // Written by the threads that copy them: pages placed where they run,
    // and no reads of the kernel's shared zero page.
    for_chunks(bytes, [&](int64_t at, size_t n) { std::memset(a.as<char>() + at, 1, n); });
    for_chunks(bytes, [&](int64_t at, size_t n) { std::memset(b.as<char>() + at, 2, n); });
    std::vector<double> secs;
    for (int i = -2; i < 10; ++i) {
      const auto start = std::chrono::steady_clock::now();
      copy_within(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
      if (i >= 0) secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(secs.begin(), secs.end());
    return 2.0 * static_cast<double>(bytes) / secs[secs.size() / 2] / 1e9;
  }
  // Resident pages (the second field of /proc/self/statm); 0 where there is none.
  int64_t memory_used_bytes() const override {
    std::ifstream statm("/proc/self/statm");
    int64_t total_pages = 0, resident_pages = 0;
    if (!(statm >> total_pages >> resident_pages)) return 0;
    return resident_pages * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  }

  void embedding(const EmbeddingParams& p) override { cpu::embedding(p); }
  void linear(const LinearParams& p) override { cpu::linear(p); }
  void attention(const AttentionParams& p) override { cpu::attention(p); }
  void argmax(const ArgmaxParams& p) override { cpu::argmax(p); }
  void sample(const SampleParams& p) override { cpu::sample(p); }
  void next_tokens(const NextTokensParams& p) override { cpu::next_tokens(p); }

 private:
  static Buffer aligned(int64_t bytes, size_t alignment) {
    const size_t size = (static_cast<size_t>(bytes > 0 ? bytes : 1) + 63) / 64 * 64;
    void* p = nullptr;
    LS_REQUIRE(posix_memalign(&p, alignment, size) == 0, ErrorKind::kInvalidArgument,
               "out of host memory allocating {} bytes", bytes);
    return Buffer(p, bytes, [](void* q) { std::free(q); });
  }
  DType weights_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(DType weights) { return std::make_unique<CpuBackend>(weights); }

}  // namespace lockstep
