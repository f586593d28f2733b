// The CPU backend's attention (cpu::attention) on the threads OpenMP gives it
// (OMP_NUM_THREADS): a causal prefill of one sequence, and one decode token
// at the end of that sequence, over a KV cache allocated as the engine's.
//
//   cpu_attention_bench [PROMPT [HEADS KV_HEADS HEAD_DIM]]
//
// Defaults: 1024 tokens, 14 heads over 2 kv heads of 64 (Qwen2.5-0.5B's
// shape). Prints the median of the runs that fit in ~0.5 s (at least 5).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "engine/backend.h"
#include "kernels/attention.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double median_ms(F run) {
  run();  // warm-up
  std::vector<double> ms;
  const Clock::time_point start = Clock::now();
  while (ms.size() < 5 || std::chrono::duration<double>(Clock::now() - start).count() < 0.5) {
    const Clock::time_point t0 = Clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lockstep;
  const int64_t prompt = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int64_t heads = argc > 4 ? std::atoll(argv[2]) : 14, kv_heads = argc > 4 ? std::atoll(argv[3]) : 2;
  const int64_t head_dim = argc > 4 ? std::atoll(argv[4]) : 64;
  if (prompt < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || head_dim < 1) {
    std::fprintf(stderr, "usage: %s [PROMPT [HEADS KV_HEADS HEAD_DIM]] (HEADS a multiple of KV_HEADS)\n", argv[0]);
    return 2;
  }
  const KvCacheShape cache{.num_slots = 1, .max_seq = prompt + 1, .num_kv_heads = kv_heads, .head_dim = head_dim};
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = uniform(rng);
    return v;
  };
  // The cache as the engine holds it (the CPU backend's buffers).
  const auto backend = make_cpu_backend();
  Buffer k = backend->alloc(cache.slot_stride() * 4), v = backend->alloc(cache.slot_stride() * 4);
  for (const Buffer* b : {&k, &v}) {
    const std::vector<float> values = random(cache.slot_stride());
    std::copy(values.begin(), values.end(), b->as<float>());
  }
  const std::vector<float> qkv = random((prompt + 1) * (heads + 2 * kv_heads) * head_dim);
  std::vector<float> out(static_cast<size_t>((prompt + 1) * heads * head_dim));
  std::vector<int32_t> positions(static_cast<size_t>(prompt + 1)), slots(positions.size(), 0);
  std::iota(positions.begin(), positions.end(), 0);
  auto params = [&](int64_t first, int64_t tokens) {
    return AttentionParams{.qkv = qkv.data(), .k_cache = k.data(), .v_cache = v.data(), .slots = slots.data(),
                           .positions = positions.data() + first, .out = out.data(), .tokens = tokens,
                           .num_heads = heads, .cache = cache, .scale = 0.125f};
  };
  const AttentionParams prefill = params(0, prompt), decode = params(prompt, 1);
  const double prefill_ms = median_ms([&] { cpu::attention(prefill); });
  const double decode_ms = median_ms([&] { cpu::attention(decode); });
  // q·k and p·v: 4 flops a (query head, key, element).
  const double prefill_flop = 4.0 * heads * head_dim * (static_cast<double>(prompt) * (prompt + 1) / 2);
  std::printf("heads %lld / kv heads %lld, head_dim %lld\n", static_cast<long long>(heads),
              static_cast<long long>(kv_heads), static_cast<long long>(head_dim));
  std::printf("prefill %lld tokens  %9.3f ms  %6.1f GFLOP/s\n", static_cast<long long>(prompt), prefill_ms,
              prefill_flop / (prefill_ms * 1e6));
  std::printf("decode at %lld       %9.3f ms\n", static_cast<long long>(prompt), decode_ms);
  return 0;
}
