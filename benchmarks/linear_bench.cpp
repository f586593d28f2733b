// The decode step's weight stream, one linear layer at a time: cuda::linear
// (own GEMV for 1-2 rows, cuBLASLt from 3) on the llama3-8b layer shapes and
// the LM head, for 1-64 rows, timed inside a CUDA graph as the decode step
// runs it, against the device-to-device copy bandwidth measured in the same
// run. Random bf16 data (never zeros); layers smaller than 256 MB cycle over
// several copies of their weights so that L2 (60 MB on the H200) cannot serve
// them, as it cannot in a decode step. Prints one row per (shape, rows).
// The "+norm" and "+silu" rows run the op's fused stages (input RMSNorm with
// the residual add, SiLU·mul) at 1-2 rows, where the GEMV fuses them: their
// time against the plain row is what the fusion costs inside the kernel.
// "qkv+norm+rope" adds RoPE with the KV append (fused into the GEMV at 1-2
// rows); "+qknorm" gives it q/k norm weights, which keeps the rope kernel
// separate: the two rows' difference is what the fusion saves.
// With --algos it times instead, for the plain shapes at 4-64 rows (cuBLASLt),
// every algorithm cuBLASLt's heuristic offers (up to 16), and prints the
// heuristic's first choice, the fastest, and the fastest's configuration.
// With --tp N it times the plain shapes as one of N tensor-parallel ranks
// holds them (column-parallel qkv, gate_up and lm_head split their outputs,
// row-parallel o_proj and down their inputs).
// With --alternating it times the four layer products at 8, 32 and 64 rows
// as the step alternates them, against the sum of each back to back, also
// with the step's norm, rope and SiLU·mul kernels between them.
// Run: build/linear_bench [iterations] [--algos | --alternating | --tp N]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "common/dtype.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/linear.h"

namespace {

using lockstep::DType;

enum class Rope { kNone, kFusable, kQkNorm };

struct Shape {
  const char* name;
  int64_t in, out;
  bool norm = false, silu = false;
  Rope rope = Rope::kNone;
};

// llama3-8b: hidden 4096, 32/8 heads of 128, intermediate 14336, vocab 128256.
constexpr Shape kShapes[] = {{"qkv", 4096, 6144},
                             {"o_proj", 4096, 4096},
                             {"gate_up", 4096, 2 * 14336},
                             {"down", 14336, 4096},
                             {"lm_head", 4096, 128256},
                             {"qkv+norm", 4096, 6144, true, false},
                             {"gate_up+norm+silu", 4096, 2 * 14336, true, true},
                             {"lm_head+norm", 4096, 128256, true, false},
                             {"qkv+norm+rope", 4096, 6144, true, false, Rope::kFusable},
                             {"qkv+norm+qknorm+rope", 4096, 6144, true, false, Rope::kQkNorm}};
constexpr int64_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kCacheSeq = 2048;

void* random_device_bf16(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> host(static_cast<size_t>(count));
  for (float& v : host) v = dist(rng);
  return lockstep::bench::upload_bf16(host);
}

// "id/tile/splitK/stages" of a cuBLASLt algorithm.
std::string algo_config(const cublasLtMatmulAlgo_t& algo) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) {
    int32_t v = -1;  // every attribute read here is 4 bytes
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
    return v;
  };
  return std::to_string(get(CUBLASLT_ALGO_CONFIG_ID)) + "/" + std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID)) +
         "/" + std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + "/" +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID));
}

// The heuristic's algorithms for the plain shapes at 4-64 rows, each timed
// as the main table times the op.
void sweep_algorithms(lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters, double copy,
                      std::mt19937& rng) {
  std::printf("cuBLASLt algorithms (id/tile/splitK/stages)\n%-10s %5s %6s %10s %10s %8s %6s %s\n", "layer", "rows",
              "algos", "first us", "best us", "%copy", "best#", "best config");
  for (const Shape& s : kShapes) {
    if (s.norm || s.silu || s.rope != Rope::kNone) continue;
    const int64_t weight_bytes = 2 * s.in * s.out;
    const int copies = static_cast<int>(std::max<int64_t>(1, ((int64_t{256} << 20) + weight_bytes - 1) / weight_bytes));
    std::vector<void*> w;
    for (int c = 0; c < copies; ++c) w.push_back(random_device_bf16(s.in * s.out, rng));
    void* x = random_device_bf16(64 * s.in, rng);
    void* y = random_device_bf16(64 * s.out, rng);
    for (int64_t rows : {4, 8, 16, 32, 64}) {
      lockstep::LinearParams p{.x = x, .weight = w[0], .y = y, .rows = rows, .in_features = s.in,
                               .out_features = s.out, .act_dtype = DType::kBF16, .weight_dtype = DType::kBF16};
      const std::vector<cublasLtMatmulAlgo_t> algos = ctx.algorithms(p, 16);
      double first = 0.0, best = 1e30;
      size_t best_at = 0;
      for (size_t a = 0; a < algos.size(); ++a) {
        ctx.set_algorithm(p, algos[a]);
        lockstep::cuda::linear(p, ctx, stream);
        LS_CHECK_CUDA(cudaStreamSynchronize(stream));
        const double us = lockstep::bench::graphed_us(stream, std::max(copies, 8), iters, [&](int i) {
          p.weight = w[static_cast<size_t>(i % copies)];
          lockstep::cuda::linear(p, ctx, stream);
        });
        if (a == 0) first = us;
        if (us < best) best = us, best_at = a;
      }
      ctx.set_algorithm(p, algos.front());
      const double bytes = 2.0 * static_cast<double>(s.in * s.out + rows * (s.in + s.out));
      std::printf("%-10s %5lld %6zu %10.2f %10.2f %8.1f %6zu %s\n", s.name, static_cast<long long>(rows),
                  algos.size(), first, best, 100.0 * bytes / best / 1e3 / copy, best_at,
                  algo_config(algos[best_at]).c_str());
    }
    for (void* c : w) cudaFree(c);
    cudaFree(x);
    cudaFree(y);
  }
}

// One shape's device buffers: its weights (cycled copies), the product's
// input and output, and the fused stages' inputs (norm, SiLU·mul, RoPE
// with the KV append at the cache's end, one slot a row).
struct ShapeBuffers {
  static constexpr int64_t kMaxRows = 64;
  std::vector<void*> weights;
  void *x, *y, *normed, *residual, *residual_out, *norm_weight, *act, *slots, *positions, *inv_freq, *qk_norm;
  void *k_cache = nullptr, *v_cache = nullptr;
  lockstep::KvCacheShape cache{.num_slots = 2, .max_seq = kCacheSeq, .num_kv_heads = kKvHeads, .head_dim = kHeadDim};

  ShapeBuffers(const Shape& s, std::mt19937& rng) {
    const int64_t weight_bytes = 2 * s.in * s.out;
    const int64_t copies = std::max<int64_t>(1, ((int64_t{256} << 20) + weight_bytes - 1) / weight_bytes);
    for (int64_t c = 0; c < copies; ++c) weights.push_back(random_device_bf16(s.in * s.out, rng));
    x = random_device_bf16(kMaxRows * s.in, rng);
    y = random_device_bf16(kMaxRows * s.out, rng);
    normed = random_device_bf16(kMaxRows * s.in, rng);
    residual = random_device_bf16(kMaxRows * s.in, rng);
    residual_out = random_device_bf16(kMaxRows * s.in, rng);
    norm_weight = random_device_bf16(s.in, rng);
    act = random_device_bf16(kMaxRows * s.out / 2, rng);
    std::vector<int32_t> ids(kMaxRows);
    for (int32_t i = 0; i < kMaxRows; ++i) ids[static_cast<size_t>(i)] = i % 2;
    slots = lockstep::bench::upload_bytes(ids.data(), ids.size() * 4);
    for (int32_t& i : ids) i = static_cast<int32_t>(kCacheSeq - 1);
    positions = lockstep::bench::upload_bytes(ids.data(), ids.size() * 4);
    std::vector<float> freq(kHeadDim / 2, 1e-3f);
    inv_freq = lockstep::bench::upload_bytes(freq.data(), freq.size() * 4);
    qk_norm = random_device_bf16(kHeadDim, rng);
    if (s.rope != Rope::kNone) {
      k_cache = random_device_bf16(cache.num_slots * cache.slot_stride(), rng);
      v_cache = random_device_bf16(cache.num_slots * cache.slot_stride(), rng);
    }
  }
  ~ShapeBuffers() {
    for (void* c : weights) cudaFree(c);
    for (void* b : {x, y, normed, residual, residual_out, norm_weight, act, slots, positions, inv_freq, qk_norm,
                    k_cache, v_cache})
      cudaFree(b);
  }
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;
};

// The op as the decode step calls it for `s` at `rows` rows, its stages included.
lockstep::LinearParams shape_params(const Shape& s, const ShapeBuffers& b, int64_t rows) {
  lockstep::LinearParams p{.x = b.x, .weight = b.weights[0], .y = b.y, .rows = rows, .in_features = s.in,
                           .out_features = s.out, .act_dtype = DType::kBF16, .weight_dtype = DType::kBF16};
  if (s.norm) {  // the norm reads x (as the partial) and a residual, writes the new residual
    p.x = b.normed;
    p.input_norm = lockstep::RmsNormParams{.x = b.x, .residual = b.residual, .residual_out = b.residual_out,
                                           .weight = b.norm_weight, .out = b.normed, .rows = rows, .cols = s.in,
                                           .eps = 1e-5f, .dtype = DType::kBF16};
  }
  if (s.silu)
    p.silu_mul = lockstep::SiluMulParams{.gate_up = b.y, .out = b.act, .rows = rows, .inter = s.out / 2,
                                         .dtype = DType::kBF16};
  if (s.rope != Rope::kNone) {
    const bool qk = s.rope == Rope::kQkNorm;
    const auto* pos = static_cast<const int32_t*>(b.positions);
    p.qk_norm_rope = lockstep::QkNormRopeParams{
        .qkv = b.y, .positions = pos, .inv_freq = static_cast<const float*>(b.inv_freq),
        .q_norm_weight = qk ? b.qk_norm : nullptr, .k_norm_weight = qk ? b.qk_norm : nullptr, .tokens = rows,
        .num_heads = kHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim, .eps = 1e-5f, .dtype = DType::kBF16,
        .kv_append = lockstep::KvAppendParams{.qkv = b.y, .k_cache = b.k_cache, .v_cache = b.v_cache,
                                              .slots = static_cast<const int32_t*>(b.slots), .positions = pos,
                                              .tokens = rows, .num_heads = kHeads, .cache = b.cache,
                                              .dtype = DType::kBF16}};
  }
  return p;
}

// The plain shapes as one of `tp` ranks holds them.
std::vector<Shape> tensor_parallel_shapes(int64_t tp) {
  std::vector<Shape> out;
  for (const Shape& s : kShapes) {
    if (s.norm || s.silu || s.rope != Rope::kNone) continue;
    const bool row_parallel = std::string(s.name) == "o_proj" || std::string(s.name) == "down";
    out.push_back({s.name, row_parallel ? s.in / tp : s.in, row_parallel ? s.out : s.out / tp});
  }
  return out;
}

// One table row per rows count of `s` (the fused shapes only at 1-2 rows).
void bench_shape(const Shape& s, lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters, double copy,
                 std::mt19937& rng) {
  const ShapeBuffers b(s, rng);
  const int copies = static_cast<int>(b.weights.size());
  for (int64_t rows : {1, 2, 4, 8, 16, 32, 64}) {
    if ((s.norm || s.silu) && rows > 2) break;
    lockstep::LinearParams p = shape_params(s, b, rows);
    lockstep::cuda::linear(p, ctx, stream);  // plans made outside the capture
    LS_CHECK_CUDA(cudaStreamSynchronize(stream));
    const double us = lockstep::bench::graphed_us(stream, std::max(copies, 8), iters, [&](int i) {
      p.weight = b.weights[static_cast<size_t>(i % copies)];
      lockstep::cuda::linear(p, ctx, stream);
    });
    const double bytes = 2.0 * static_cast<double>(s.in * s.out + rows * (s.in + s.out));
    const double gbs = bytes / us / 1e3;
    std::printf("%-18s %5lld %10.2f %10.0f %8.1f\n", s.name, static_cast<long long>(rows), us, gbs,
                100.0 * gbs / copy);
  }
}

// A layer's products at `rows` rows alternating as a decode step runs them
// (each on its next weight copy): `shapes` indexes kShapes. Returns the
// layer's microseconds alternating and the sum of each shape replayed back
// to back. With the shapes that carry the norm, RoPE (and KV append) and
// SiLU·mul stages, the layer also runs those kernels between the products
// as the step does.
std::pair<double, double> alternating_us(lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters,
                                         int64_t rows, const std::vector<int>& shapes, std::mt19937& rng) {
  std::vector<std::unique_ptr<ShapeBuffers>> buffers;
  std::vector<lockstep::LinearParams> params;
  double alone = 0.0;
  for (int i : shapes) {
    buffers.push_back(std::make_unique<ShapeBuffers>(kShapes[i], rng));
    params.push_back(shape_params(kShapes[i], *buffers.back(), rows));
    lockstep::cuda::linear(params.back(), ctx, stream);  // plans made outside the capture
    const auto& w = buffers.back()->weights;
    lockstep::LinearParams& p = params.back();
    alone += lockstep::bench::graphed_us(stream, std::max<int>(static_cast<int>(w.size()), 8), iters, [&](int k) {
      p.weight = w[static_cast<size_t>(k) % w.size()];
      lockstep::cuda::linear(p, ctx, stream);
    });
  }
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  const double mixed = lockstep::bench::graphed_us(stream, 24, iters, [&](int k) {
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& w = buffers[i]->weights;
      params[i].weight = w[static_cast<size_t>(k) % w.size()];
      lockstep::cuda::linear(params[i], ctx, stream);
    }
  });
  return {mixed, alone};
}

// The four layer products alternating, without and with the step's small
// kernels between them, and those again under the device-wide preference for
// shared memory over L1 (whether the SMs' L1/shared split changing between
// the small kernels and the products costs time).
void bench_alternating(lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters, int64_t rows,
                       std::mt19937& rng) {
  const std::vector<int> plain = {0, 1, 2, 3};           // qkv, o_proj, gate_up, down
  const std::vector<int> with_stages = {8, 1, 6, 3};     // + norm and rope, + norm and SiLU·mul
  const auto [mixed, alone] = alternating_us(ctx, stream, iters, rows, plain, rng);
  const auto [staged, staged_alone] = alternating_us(ctx, stream, iters, rows, with_stages, rng);
  LS_CHECK_CUDA(cudaDeviceSetCacheConfig(cudaFuncCachePreferShared));
  const auto [shared, shared_alone] = alternating_us(ctx, stream, iters, rows, with_stages, rng);
  LS_CHECK_CUDA(cudaDeviceSetCacheConfig(cudaFuncCachePreferNone));
  std::printf("%lld rows, us a layer (alternating / each back to back): products %.2f / %.2f; with the norms, "
              "rope and SiLU·mul %.2f / %.2f; the same preferring shared memory %.2f / %.2f\n",
              static_cast<long long>(rows), mixed, alone, staged, staged_alone, shared, shared_alone);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 50;
  const bool algos = argc > 2 && std::string(argv[2]) == "--algos";
  const bool alternating = argc > 2 && std::string(argv[2]) == "--alternating";
  const int64_t tp = argc > 3 && std::string(argv[2]) == "--tp" ? std::atoll(argv[3]) : 1;
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  lockstep::cuda::LinearContext ctx;
  std::mt19937 rng(5);
  const double copy = lockstep::bench::copy_gbs(stream);
  std::printf("copy bandwidth %.0f GB/s\n", copy);
  if (algos) {
    sweep_algorithms(ctx, stream, iters, copy, rng);
    return 0;
  }
  if (alternating) {
    for (int64_t rows : {8, 32, 64}) bench_alternating(ctx, stream, iters, rows, rng);
    return 0;
  }
  std::printf("%-18s %5s %10s %10s %8s%s\n", "layer", "rows", "us", "GB/s", "%copy",
              tp > 1 ? (" (one of " + std::to_string(tp) + " tensor-parallel ranks)").c_str() : "");
  if (tp > 1) {
    for (const Shape& s : tensor_parallel_shapes(tp)) bench_shape(s, ctx, stream, iters, copy, rng);
    return 0;
  }
  for (const Shape& s : kShapes) bench_shape(s, ctx, stream, iters, copy, rng);
  return 0;
}
