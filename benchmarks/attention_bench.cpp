// Decode attention alone: cuda::attention on llama3-8b's shape (32 q heads,
// 8 kv heads of 128, bf16), one token per sequence at a context of CTX keys,
// for batch 1-64, timed inside a CUDA graph as the decode step runs it: one
// launch per layer over 32 layers' distinct caches, so that L2 (60 MB on the
// H200) cannot serve a layer's keys to the next launch. The cache holds a
// repeated random pattern (the kernel's time does not depend on the values).
// The split rule's choice and smaller caps on the splits (max_splits), with
// no_lower_writes (as a decode step sets it) and, for the rule, without.
// Prints one row per (batch, cap): microseconds per launch, the KV bytes read
// per second and their share of the copy bandwidth measured in the same run.
// The microseconds are a launch rate: each launch is a programmatic dependent
// of the one before, whose ramp and tail it overlaps, so a launch alone (as in
// the step, after the small rope kernel and before cuBLASLt's o_proj) takes
// longer (H100, batch 32: 45.5 us a launch here, 50.9-51.1 us from a launch's
// first block to its last under kernel_timeline; benchmarks/RESULTS.md).
// Run: build/attention_bench [iterations] [ctx] [batches caps [head_dim [pdl]]]
// (batches and caps, comma-separated lists, select the rows of every pair,
// e.g. `1 0` one row for a profiler, `1,8 0,2,3` six; head_dim, default 128,
// another head size with the same heads; pdl 0 launches each attention only
// once the one before has ended, so that every launch's ramp and tail show).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "common/integers.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

namespace {

using lockstep::DType;

constexpr int64_t kHeads = 32, kKvHeads = 8, kLayers = 32, kMaxBatch = 64;

struct Row {
  int64_t batch;
  int64_t cap;  // max_splits; 0: the rule's choice
  bool early = true;  // no_lower_writes: key copies may start before the launch before ends
};

// Device buffer of `count` bf16 values: a 4 MiB random pattern repeated.
void* patterned_bf16(int64_t count, std::mt19937& rng) {
  const int64_t pattern = std::min<int64_t>(count, int64_t{2} << 20);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(pattern));
  for (float& v : host) v = dist(rng);
  void* src = lockstep::bench::upload_bf16(host);
  void* dst = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&dst, static_cast<size_t>(count) * 2));
  for (int64_t at = 0; at < count; at += pattern)
    LS_CHECK_CUDA(cudaMemcpy(static_cast<char*>(dst) + at * 2, src,
                             static_cast<size_t>(std::min(pattern, count - at)) * 2, cudaMemcpyDeviceToDevice));
  cudaFree(src);
  return dst;
}

std::vector<Row> all_rows() {
  std::vector<Row> rows;
  for (int64_t batch : {1, 8, 32, 64}) rows.push_back({batch, 0, false});
  for (int64_t cap : {0, 12, 8, 6, 4, 2}) rows.push_back({1, cap});
  for (int64_t cap : {0, 4, 3, 2, 1}) rows.push_back({8, cap});
  for (int64_t cap : {0, 2, 1}) rows.push_back({32, cap});
  for (int64_t cap : {0, 2, 1}) rows.push_back({64, cap});
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  const int64_t ctx = argc > 2 ? std::atoll(argv[2]) : 1024;
  std::vector<Row> rows = all_rows();
  if (argc > 4) {
    rows.clear();
    try {
      for (int64_t batch : lockstep::parse_int_list(argv[3], "batches", "batch size"))
        for (int64_t cap : lockstep::parse_int_list(argv[4], "caps", "split cap")) rows.push_back(Row{batch, cap});
    } catch (const lockstep::Error& e) {
      std::fprintf(stderr, "attention_bench: %s\n", e.what());
      return 2;
    }
    for (const Row& r : rows)
      if (r.batch < 1 || r.batch > kMaxBatch || r.cap < 0) {
        std::fprintf(stderr, "attention_bench: batch %lld (1-%lld) or cap %lld (>= 0) out of range\n",
                     static_cast<long long>(r.batch), static_cast<long long>(kMaxBatch),
                     static_cast<long long>(r.cap));
        return 2;
      }
  }
  const int64_t head_dim = argc > 5 ? std::atoll(argv[5]) : 128;
  if (argc > 6 && std::atoi(argv[6]) == 0) lockstep::cuda::set_overlapped_launches(false);
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int num_sms = 0;
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(7);
  const double copy = lockstep::bench::copy_gbs(stream);

  const lockstep::KvCacheShape cache{.num_slots = kMaxBatch, .max_seq = ctx + 128, .num_kv_heads = kKvHeads,
                               .head_dim = head_dim};
  const int64_t layer_elems = cache.num_slots * cache.slot_stride();
  void* k = patterned_bf16(kLayers * layer_elems, rng);
  void* v = patterned_bf16(kLayers * layer_elems, rng);
  void* qkv = patterned_bf16(kMaxBatch * (kHeads + 2 * kKvHeads) * head_dim, rng);
  void* out = patterned_bf16(kMaxBatch * kHeads * head_dim, rng);
  std::vector<int32_t> slots(kMaxBatch), positions(kMaxBatch, static_cast<int32_t>(ctx));
  for (int64_t t = 0; t < kMaxBatch; ++t) slots[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  int32_t *d_slots = nullptr, *d_positions = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&d_slots, kMaxBatch * 4));
  LS_CHECK_CUDA(cudaMalloc(&d_positions, kMaxBatch * 4));
  LS_CHECK_CUDA(cudaMemcpy(d_slots, slots.data(), kMaxBatch * 4, cudaMemcpyHostToDevice));
  LS_CHECK_CUDA(cudaMemcpy(d_positions, positions.data(), kMaxBatch * 4, cudaMemcpyHostToDevice));
  const int64_t ws_bytes = lockstep::cuda::attention_workspace_bytes(num_sms);
  void* ws = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&ws, static_cast<size_t>(ws_bytes)));
  lockstep::cuda::clear_attention_workspace(ws, num_sms, stream);

  std::printf("copy bandwidth %.0f GB/s; ctx %lld; head_dim %lld; %d SMs\n", copy, static_cast<long long>(ctx),
              static_cast<long long>(head_dim), num_sms);
  std::printf("%5s %5s %5s %10s %10s %8s\n", "batch", "cap", "early", "us", "GB/s", "%copy");
  for (const Row& r : rows) {
    lockstep::AttentionParams p{.qkv = qkv,
                                .k_cache = k,
                                .v_cache = v,
                                .slots = d_slots,
                                .positions = d_positions,
                                .out = out,
                                .tokens = r.batch,
                                .num_heads = kHeads,
                                .cache = cache,
                                .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
                                .dtype = DType::kBF16,
                                .workspace = ws,
                                .workspace_bytes = ws_bytes,
                                .no_lower_writes = r.early,  // one token per slot, as a decode step
                                .max_splits = r.cap};
    const auto layer = [&](int i) {
      p.k_cache = static_cast<char*>(k) + i * layer_elems * 2;
      p.v_cache = static_cast<char*>(v) + i * layer_elems * 2;
      lockstep::cuda::attention(p, num_sms, stream);
    };
    layer(0);
    LS_CHECK_CUDA(cudaStreamSynchronize(stream));
    const double us = lockstep::bench::graphed_us(stream, kLayers, iters, layer);
    const double bytes = 2.0 * 2.0 * static_cast<double>(r.batch * (ctx + 1) * kKvHeads * head_dim);
    const double gbs = bytes / us / 1e3;
    std::printf("%5lld %5lld %5s %10.2f %10.0f %8.1f\n", static_cast<long long>(r.batch),
                static_cast<long long>(r.cap), r.early ? "yes" : "no", us, gbs, 100.0 * gbs / copy);
  }
  for (void* b : {k, v, qkv, out, ws}) cudaFree(b);
  cudaFree(d_slots);
  cudaFree(d_positions);
  return 0;
}
