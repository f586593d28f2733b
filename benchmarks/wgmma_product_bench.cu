// Experiment: products of 5-64 rows through Hopper's wgmma, W and x tiles
// brought by the bulk tensor copy engine (TMA) into a shared-memory ring, a
// persistent stream-K grid of one block an SM, and W's first stages copied
// before the programmatic-launch wait; against cuda::linear (cuBLASLt) on
// the llama3-8b layer shapes. No engine path uses it: on an H100 it trails
// cuBLASLt at every shape and row count, and its bare TMA stream (no
// products, no fixup) leads cuBLASLt's layer by only ~3% (RESULTS.md and
// NOTES.md, twenty-ninth session). Why it was tried: the step's products are
// cuBLASLt's, which cannot be programmatic dependents or primaries
// (seventeenth session), and the eight own products before it ran on
// mma.sync, whose operand loads bound the eleventh session's TMA stream-K.
//
// y = x·Wᵀ, x [rows, K] bf16 row-major, W [N, K] bf16 row-major, N a
// multiple of 64 H and K of 64. A block: warps 0-3 one consumer warpgroup
// (H m64nNk16 wgmmas a k step of 16, for a tile of 64 H features), warp 4's
// lane 0 the producer. A unit is one tile x 64 k: W 8 H KB and x N x 128
// bytes, 128-byte swizzled as TMA writes them and wgmma reads them. Block c
// of G takes units [c U / G, (c + 1) U / G) in (tile, k) order; a tile split
// between blocks leaves float32 partials (slot 0 for a block's first
// segment, 1 for its last), stored at the block's end, and the tile's last
// block to arrive sums them in block order (deterministic) and stores.
// Knock-outs (wrong results, timing only) leave out x's copies after the
// first ring or the fixup.
// Run: build/wgmma_product_bench [iterations]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/linear.h"

namespace {

using lockstep::DType;
using lockstep::bench::download_bf16;
using lockstep::bench::fill_random;

constexpr int kTileK = 64;  // 128 bytes: one swizzle span
// A tile of H m64 halves: 64 H features, W 8 H KB a stage.
template <int H>
constexpr int kTileFeatures = 64 * H;
template <int H>
constexpr int kWBytes = kTileFeatures<H> * kTileK * 2;
template <int NR, int H>
constexpr int kStageBytes = kWBytes<H> + NR * kTileK * 2;
constexpr int kConsumers = 128;     // one warpgroup
constexpr int kThreads = kConsumers + 32;

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void barrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void barrier_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void barrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Returns once the phase of parity `parity` has completed (a fresh barrier
// counts its phase before the first as completed with parity 1).
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// A 2-D box of `map` at (inner, outer) into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int inner, int outer, uint64_t* bar,
                                         uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(inner), "r"(outer), "l"(policy)
      : "memory");
}

__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t evict_last_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// wgmma's shared-memory matrix descriptor for a K-major tile of 128-byte
// rows, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t matrix_descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Keeps the compiler from moving accumulator accesses across wgmma's asynchronous window.
template <int R>
__device__ __forceinline__ void fence_registers(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, 128;" ::: "memory"); }

__device__ __forceinline__ void wgmma_m64n8(float (&d)[4], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n16(float (&d)[8], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n32(float (&d)[16], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_m64n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(scale_d));
}

template <int NR>
__device__ __forceinline__ void wgmma_rows(float (&d)[NR / 2], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (NR == 8) wgmma_m64n8(d, a, b, scale_d);
  else if constexpr (NR == 16) wgmma_m64n16(d, a, b, scale_d);
  else if constexpr (NR == 32) wgmma_m64n32(d, a, b, scale_d);
  else wgmma_m64n64(d, a, b, scale_d);
}

struct ProductArgs {
  __nv_bfloat16* y;
  float* partial;  // [block][2 slots][H NR / 8 float4s][128 threads]
  int* arrivals;   // one a tile, zero between launches
  int64_t n, k;
  int rows, stages;
  int mode;          // diagnostic knock-outs (wrong results): the bits below
  int early;         // W stages copied before the programmatic-launch wait (at most the ring)
};

constexpr int kNoXAfterRing = 1;  // x copied for the first ring only
constexpr int kNoFixup = 2;       // split tiles stored by each block, not summed

struct Range {
  int64_t begin, end;
};

__device__ __forceinline__ int64_t unit_begin(int64_t block, int64_t blocks, int64_t units) {
  return block * units / blocks;
}

// The block whose range holds unit u.
__device__ __forceinline__ int64_t block_of(int64_t u, int64_t blocks, int64_t units) {
  return ((u + 1) * blocks - 1) / units;
}

template <int NR, int H>
__device__ __forceinline__ void store_tile(const ProductArgs& a, int64_t tile, const float (&acc)[H][NR / 2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int i = 0; i < NR / 8; ++i)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t feature = tile * kTileFeatures<H> + h * 64 + 16 * warp + lane / 4 + 8 * (r / 2);
        const int row = 8 * i + 2 * (lane % 4) + r % 2;
        if (row < a.rows) a.y[row * a.n + feature] = __float2bfloat16(acc[h][4 * i + r]);
      }
}

// Tile `tile`'s partial slot for block `block` of `blocks`: 0 for a block's first segment, 1 for its last.
__device__ __forceinline__ int64_t partial_slot(int64_t block, int64_t tile, int64_t kc, int64_t blocks,
                                                int64_t units) {
  return block * 2 + (unit_begin(block, blocks, units) >= tile * kc ? 0 : 1);
}

// A slot's float4 (h, q) of thread t at [(h NR / 8 + q) 128 + t]: a warp's store or load is 512
// contiguous bytes (a thread's values contiguous instead left 16 bytes a 128-byte line a warp
// instruction, and the fixup cost 4-13 us a launch: twenty-ninth session, call 5).
template <int NR, int H>
__device__ __forceinline__ float4* partial_of(const ProductArgs& a, int64_t slot) {
  return reinterpret_cast<float4*>(a.partial + slot * kConsumers * NR * H / 2) + threadIdx.x;
}

template <int NR, int H>
__device__ __forceinline__ void store_partial(const ProductArgs& a, int64_t tile, const float (&acc)[H][NR / 2]) {
  const int64_t kc = a.k / kTileK, units = a.n / kTileFeatures<H> * kc;
  float4* out = partial_of<NR, H>(a, partial_slot(blockIdx.x, tile, kc, gridDim.x, units));
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int q = 0; q < NR / 8; ++q)
      __stcg(out + (h * NR / 8 + q) * kConsumers, make_float4(acc[h][4 * q], acc[h][4 * q + 1], acc[h][4 * q + 2], acc[h][4 * q + 3]));
}

// The blocks holding parts of `tile`.
__device__ __forceinline__ Range tile_blocks(int64_t tile, int64_t kc, int64_t blocks, int64_t units) {
  return {block_of(tile * kc, blocks, units), block_of((tile + 1) * kc - 1, blocks, units) + 1};
}

// The tile's last block to arrive: its partials summed in block order, stored, the count reset.
template <int NR, int H>
__device__ void sum_partials(const ProductArgs& a, int64_t tile, float (&sum)[H][NR / 2]) {
  const int64_t kc = a.k / kTileK, units = a.n / kTileFeatures<H> * kc, blocks = gridDim.x;
  const Range parts = tile_blocks(tile, kc, blocks, units);
#pragma unroll
  for (int h = 0; h < H; ++h)
#pragma unroll
    for (int i = 0; i < NR / 2; ++i) sum[h][i] = 0.0f;
  for (int64_t b = parts.begin; b < parts.end; ++b) {
    const float4* in = partial_of<NR, H>(a, partial_slot(b, tile, kc, blocks, units));
#pragma unroll
    for (int h = 0; h < H; ++h)
#pragma unroll
      for (int q = 0; q < NR / 8; ++q) {
        const float4 v = __ldcg(in + (h * NR / 8 + q) * kConsumers);
        sum[h][4 * q] += v.x, sum[h][4 * q + 1] += v.y, sum[h][4 * q + 2] += v.z, sum[h][4 * q + 3] += v.w;
      }
  }
  if (threadIdx.x == 0) a.arrivals[tile] = 0;
  store_tile<NR, H>(a, tile, sum);
}

// A block's end: its split tiles' partials (first: the tile it began inside, kept in registers since;
// last: the tile it ends inside; -1 for none) stored, counted, and summed by the tiles' last blocks.
// All of it at the block's end, so that no round trip to L2 stalls the stream in between.
template <int NR, int H>
__device__ void finish_split_tiles(const ProductArgs& a, int64_t first, float (&first_acc)[H][NR / 2], int64_t last,
                                   float (&last_acc)[H][NR / 2], int* flags) {
  const int64_t kc = a.k / kTileK, units = a.n / kTileFeatures<H> * kc, blocks = gridDim.x;
  if (first >= 0) store_partial<NR, H>(a, first, first_acc);
  if (last >= 0) store_partial<NR, H>(a, last, last_acc);
  __threadfence();
  consumers_sync();
  if (threadIdx.x == 0) {
    const auto arrive = [&](int64_t tile) {
      if (tile < 0) return 0;
      const Range parts = tile_blocks(tile, kc, blocks, units);
      return atomicAdd(a.arrivals + tile, 1) == parts.end - parts.begin - 1 ? 1 : 0;
    };
    flags[0] = arrive(first), flags[1] = arrive(last);
  }
  consumers_sync();
  const bool sum_first = flags[0], sum_last = flags[1];
  if (!sum_first && !sum_last) return;
  __threadfence();
  if (sum_first) sum_partials<NR, H>(a, first, first_acc);
  if (sum_last) sum_partials<NR, H>(a, last, last_acc);
}

template <int NR, int H>
__device__ void produce(const CUtensorMap* w_map, const CUtensorMap* x_map, const ProductArgs& a, Range mine,
                        unsigned char* stages, uint64_t* full, uint64_t* empty) {
  constexpr int kStage = kStageBytes<NR, H>;
  const int64_t kc = a.k / kTileK, count = mine.end - mine.begin;
  const uint64_t w_policy = evict_first_policy();  // evict-last measured slower (call 1)
  const uint64_t x_policy = evict_last_policy();
  const bool x_once = a.mode & kNoXAfterRing;
  const auto w_of = [&](int64_t i) { return stages + (i % a.stages) * kStage; };
  const auto coords = [&](int64_t i, int& k0, int& f0) {
    const int64_t u = mine.begin + i;
    k0 = static_cast<int>(u % kc * kTileK), f0 = static_cast<int>(u / kc * kTileFeatures<H>);
  };
  // The first ring of weights does not depend on the kernel before.
  const int64_t ring = count < a.stages ? count : a.stages, early = ring < a.early ? ring : a.early;
  for (int64_t i = 0; i < early; ++i) {
    int k0, f0;
    coords(i, k0, f0);
    barrier_expect_bytes(full + i, kStage);
    tma_load(w_of(i), w_map, k0, f0, full + i, w_policy);
  }
  lockstep::cuda::wait_for_producers();
  for (int64_t i = 0; i < count; ++i) {
    int k0, f0;
    coords(i, k0, f0);
    const int s = static_cast<int>(i % a.stages);
    if (i >= early) {
      if (i >= a.stages) barrier_wait(empty + s, static_cast<uint32_t>((i / a.stages) & 1) ^ 1u);
      barrier_expect_bytes(full + s, x_once && i >= a.stages ? kWBytes<H> : kStage);
      tma_load(w_of(i), w_map, k0, f0, full + s, w_policy);
    }
    if (i < a.stages || !x_once) tma_load(w_of(i) + kWBytes<H>, x_map, k0, 0, full + s, x_policy);
  }
}

template <int NR, int H>
__device__ void consume(const ProductArgs& a, Range mine, unsigned char* stages, uint64_t* full, uint64_t* empty,
                        int* flags) {
  const int64_t kc = a.k / kTileK;
  const int lane = threadIdx.x % 32;
  float acc[H][NR / 2], first_acc[H][NR / 2];
  int64_t first = -1, i = 0, pending = -1;
  for (int64_t u = mine.begin; u < mine.end;) {
    const int64_t tile = u / kc;
    const Range seg{u, mine.end < (tile + 1) * kc ? mine.end : (tile + 1) * kc};
    for (; u < seg.end; ++u, ++i) {
      const int s = static_cast<int>(i % a.stages);
      barrier_wait(full + s, static_cast<uint32_t>((i / a.stages) & 1));
      const uint32_t w = smem_u32(stages + s * kStageBytes<NR, H>), x = w + kWBytes<H>;
#pragma unroll
      for (int h = 0; h < H; ++h) fence_registers(acc[h]);
      wgmma_fence();
#pragma unroll
      for (int j = 0; j < kTileK / 16; ++j) {
        const int scale_d = u != seg.begin || j > 0;
        const uint64_t b = matrix_descriptor(x + 32 * j);
#pragma unroll
        for (int h = 0; h < H; ++h) wgmma_rows<NR>(acc[h], matrix_descriptor(w + h * 64 * 128 + 32 * j), b, scale_d);
      }
      wgmma_commit();
      wgmma_wait<1>();
#pragma unroll
      for (int h = 0; h < H; ++h) fence_registers(acc[h]);
      if (pending >= 0 && lane == 0) barrier_arrive(empty + pending % a.stages);
      pending = i;
    }
    wgmma_wait<0>();
#pragma unroll
    for (int h = 0; h < H; ++h) fence_registers(acc[h]);
    if (lane == 0) barrier_arrive(empty + pending % a.stages);
    pending = -1;
    const bool whole = seg.begin == tile * kc && seg.end == (tile + 1) * kc;
    if (whole || (a.mode & kNoFixup)) {
      store_tile<NR, H>(a, tile, acc);
    } else if (seg.end != mine.end) {  // the block began inside this tile and goes on
      first = tile;
#pragma unroll
      for (int h = 0; h < H; ++h)
#pragma unroll
        for (int r = 0; r < NR / 2; ++r) first_acc[h][r] = acc[h][r];
    } else {
      finish_split_tiles<NR, H>(a, first, first_acc, tile, acc, flags);
      first = -1;
    }
  }
  if (first >= 0) finish_split_tiles<NR, H>(a, first, first_acc, -1, acc, flags);
  lockstep::cuda::allow_consumers_launch();
}

template <int NR, int H>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_product(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ CUtensorMap x_map,
                  ProductArgs a) {
  extern __shared__ unsigned char raw[];
  unsigned char* stages =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  auto* full = reinterpret_cast<uint64_t*>(stages + a.stages * kStageBytes<NR, H>);
  uint64_t* empty = full + a.stages;
  int* flags = reinterpret_cast<int*>(empty + a.stages);
  if (threadIdx.x == kConsumers) {
    for (int s = 0; s < a.stages; ++s) barrier_init(full + s, 1), barrier_init(empty + s, 4);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t units = a.n / kTileFeatures<H> * (a.k / kTileK);
  const Range mine{unit_begin(blockIdx.x, gridDim.x, units), unit_begin(blockIdx.x + 1, gridDim.x, units)};
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce<NR, H>(&w_map, &x_map, a, mine, stages, full, empty);
  } else {
    lockstep::cuda::wait_for_producers();
    consume<NR, H>(a, mine, stages, full, empty, flags);
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    LS_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled not found\n");
      std::exit(1);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [outer, inner] bf16 row-major matrix in boxes of box_outer x 64, 128-byte swizzle.
CUtensorMap tensor_map(const void* base, int64_t inner, int64_t outer, int box_outer) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(inner), static_cast<cuuint64_t>(outer)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(inner * 2)};
  const cuuint32_t box[2] = {kTileK, static_cast<cuuint32_t>(box_outer)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_function()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                       strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                       CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

struct Config {
  int halves = 2;  // H: m64 halves a tile (2: 128 features, 4: 256)
  int mode = 0;
  int early = 16;  // W stages before the wait (the ring at most)
  bool pdl = true;  // launched as a programmatic dependent
};

int sm_count() {
  static const int sms = [] {
    int n = 0;
    LS_CHECK_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
  }();
  return sms;
}

template <int NR, int H>
void launch_nr(const CUtensorMap& w, const CUtensorMap& x, ProductArgs a, const Config& c, cudaStream_t stream) {
  constexpr int kStage = kStageBytes<NR, H>;
  const int budget = 232448 - 1024 - 64;  // one block an SM (two measured slower: call 1)
  a.stages = std::min(16, budget / (kStage + 16));
  const size_t smem = 1024 + static_cast<size_t>(a.stages) * (kStage + 16) + 16;
  static size_t configured = 0;
  if (smem > configured) {
    LS_CHECK_CUDA(cudaFuncSetAttribute(wgmma_product<NR, H>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem)));
    configured = smem;
  }
  const int64_t units = a.n / kTileFeatures<H> * (a.k / kTileK);
  const auto grid = static_cast<unsigned>(std::min<int64_t>(units, int64_t{sm_count()}));
  a.mode = c.mode;
  a.early = c.early;
  lockstep::cuda::set_overlapped_launches(c.pdl);
  LS_LAUNCH("wgmma_product", wgmma_product<NR, H>, dim3(grid), dim3(kThreads), smem, stream, w, x, a);
}

// w_maps[0]: boxes of 128 rows (H = 2), w_maps[1]: 256 (H = 4).
void launch_product(const std::array<CUtensorMap, 2>& w, const CUtensorMap& x, int nr, const ProductArgs& a, const Config& c,
                    cudaStream_t stream) {
  if (c.halves == 4) {
    if (nr == 8) return launch_nr<8, 4>(w[1], x, a, c, stream);
    if (nr == 16) return launch_nr<16, 4>(w[1], x, a, c, stream);
    if (nr == 32) return launch_nr<32, 4>(w[1], x, a, c, stream);
    std::fprintf(stderr, "H = 4 takes at most 32 rows\n");
    std::exit(1);
  }
  if (nr == 8) return launch_nr<8, 2>(w[0], x, a, c, stream);
  if (nr == 16) return launch_nr<16, 2>(w[0], x, a, c, stream);
  if (nr == 32) return launch_nr<32, 2>(w[0], x, a, c, stream);
  launch_nr<64, 2>(w[0], x, a, c, stream);
}

struct Shape {
  const char* name;
  int64_t in, out;
};
constexpr Shape kShapes[] = {{"qkv", 4096, 6144}, {"o_proj", 4096, 4096}, {"gate_up", 4096, 28672},
                             {"down", 14336, 4096}};
constexpr int kMaxRows = 64;

// One shape's buffers: weight copies cycled so that L2 cannot serve them.
struct ShapeBuffers {
  std::vector<__nv_bfloat16*> w;
  std::vector<std::array<CUtensorMap, 2>> w_maps;
  __nv_bfloat16 *x = nullptr, *y_ref = nullptr, *y = nullptr;
  float* partial = nullptr;
  int* arrivals = nullptr;
  ShapeBuffers(const Shape& s, cudaStream_t stream) {
    const int64_t bytes = 2 * s.in * s.out;
    const int64_t copies = std::max<int64_t>(2, ((int64_t{256} << 20) + bytes - 1) / bytes);
    for (int64_t c = 0; c < copies; ++c) {
      w.push_back(nullptr);
      LS_CHECK_CUDA(cudaMalloc(&w.back(), bytes));
      fill_random<<<1024, 256, 0, stream>>>(w.back(), s.in * s.out, 17 + static_cast<uint32_t>(c), 0.03f);
      w_maps.push_back({tensor_map(w.back(), s.in, s.out, 128), tensor_map(w.back(), s.in, s.out, 256)});
    }
    LS_CHECK_CUDA(cudaMalloc(&x, 2 * kMaxRows * s.in));
    LS_CHECK_CUDA(cudaMalloc(&y_ref, 2 * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&y, 2 * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&partial, sizeof(float) * 2 * 2 * sm_count() * kConsumers * kMaxRows));
    LS_CHECK_CUDA(cudaMalloc(&arrivals, sizeof(int) * s.out / 128));
    LS_CHECK_CUDA(cudaMemsetAsync(arrivals, 0, sizeof(int) * s.out / 128, stream));
    fill_random<<<256, 256, 0, stream>>>(x, kMaxRows * s.in, 5, 1.0f);
    LS_CHECK_CUDA(cudaGetLastError());
  }
  ~ShapeBuffers() {
    for (auto* p : w) cudaFree(p);
    for (void* b : {static_cast<void*>(x), static_cast<void*>(y_ref), static_cast<void*>(y),
                    static_cast<void*>(partial), static_cast<void*>(arrivals)})
      cudaFree(b);
  }
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;
};

lockstep::LinearParams linear_params(const Shape& s, const ShapeBuffers& b, int rows) {
  return lockstep::LinearParams{.x = b.x, .weight = b.w[0], .y = b.y_ref, .rows = rows, .in_features = s.in,
                                .out_features = s.out, .act_dtype = DType::kBF16, .weight_dtype = DType::kBF16};
}

ProductArgs product_args(const Shape& s, const ShapeBuffers& b, int rows) {
  return ProductArgs{.y = b.y, .partial = b.partial, .arrivals = b.arrivals, .n = s.out, .k = s.in, .rows = rows,
                     .stages = 0, .mode = 0, .early = 0};
}

// Largest |ours - cuBLASLt| over cuBLASLt's largest |value|; -1 when two runs differ in any bit (or
// a row was left unwritten: the output is poisoned with NaN before each run).
double check(const Shape& s, const ShapeBuffers& b, int rows, int nr, const Config& c,
             lockstep::cuda::LinearContext& ctx, cudaStream_t stream) {
  lockstep::cuda::linear(linear_params(s, b, rows), ctx, stream);
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::vector<float> want = download_bf16(b.y_ref, rows * s.out);
  const CUtensorMap x_map = tensor_map(b.x, s.in, rows, nr);
  std::vector<float> runs[2];
  for (auto& got : runs) {
    LS_CHECK_CUDA(cudaMemsetAsync(b.y, 0xFF, 2 * kMaxRows * s.out, stream));
    launch_product(b.w_maps[0], x_map, nr, product_args(s, b, rows), c, stream);
    LS_CHECK_CUDA(cudaStreamSynchronize(stream));
    got = download_bf16(b.y, rows * s.out);
  }
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(runs[0][i]) || std::memcmp(&runs[0][i], &runs[1][i], sizeof(float)) != 0) return -1.0;
    worst = std::max(worst, static_cast<double>(std::fabs(runs[0][i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
  }
  return worst / scale;
}

struct Timing {
  double cublas_us, ours_us;
};

// cuBLASLt and the wgmma product with config c, each replayed in a graph cycling the weight copies.
Timing time_shape(const Shape& s, const ShapeBuffers& b, int rows, int nr, const Config& c,
                  lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters) {
  const int copies = static_cast<int>(b.w.size()), per_graph = std::max(copies, 8);
  lockstep::LinearParams p = linear_params(s, b, rows);
  const double cublas = lockstep::bench::graphed_us(stream, per_graph, iters, [&](int i) {
    p.weight = b.w[static_cast<size_t>(i % copies)];
    lockstep::cuda::linear(p, ctx, stream);
  });
  const CUtensorMap x_map = tensor_map(b.x, s.in, rows, nr);
  const ProductArgs a = product_args(s, b, rows);
  const double ours = lockstep::bench::graphed_us(stream, per_graph, iters, [&](int i) {
    launch_product(b.w_maps[static_cast<size_t>(i % copies)], x_map, nr, a, c, stream);
  });
  return {cublas, ours};
}

// A layer's four products in turn (qkv, o_proj, gate_up, down, each on its next weight copy), as the
// step runs them: cuBLASLt, then ours with config c.
Timing time_layer(const std::vector<ShapeBuffers*>& all, int rows, int nr, const Config& c,
                  lockstep::cuda::LinearContext& ctx, cudaStream_t stream, int iters) {
  const int per_graph = 32;
  std::vector<CUtensorMap> x_maps;
  for (size_t j = 0; j < all.size(); ++j) x_maps.push_back(tensor_map(all[j]->x, kShapes[j].in, rows, nr));
  const auto body = [&](bool ours) {
    return [&, ours](int i) {
      const size_t j = static_cast<size_t>(i % 4);
      const ShapeBuffers& b = *all[j];
      const size_t copy = static_cast<size_t>(i / 4) % b.w.size();
      if (ours) {
        launch_product(b.w_maps[copy], x_maps[j], nr, product_args(kShapes[j], b, rows), c, stream);
      } else {
        lockstep::LinearParams p = linear_params(kShapes[j], b, rows);
        p.weight = b.w[copy];
        lockstep::cuda::linear(p, ctx, stream);
      }
    };
  };
  const double cublas = 4.0 * lockstep::bench::graphed_us(stream, per_graph, iters, body(false));
  const double ours = 4.0 * lockstep::bench::graphed_us(stream, per_graph, iters, body(true));
  return {cublas, ours};
}

const char* describe(const Config& c) {
  static char text[96];
  std::snprintf(text, sizeof text, "H%d early %2d%s%s%s", c.halves, c.early, c.pdl ? "" : " no-pdl",
                c.mode & kNoXAfterRing ? " -x" : "", c.mode & kNoFixup ? " -fixup" : "");
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy = lockstep::bench::copy_gbs(stream);
  std::printf("copy bandwidth %.0f GB/s; %d SMs\n", copy, sm_count());
  lockstep::cuda::LinearContext ctx;
  std::vector<ShapeBuffers*> all;
  for (const Shape& s : kShapes) all.push_back(new ShapeBuffers(s, stream));
  const std::vector<Config> configs = {
      {.halves = 2, .early = 16}, {.halves = 2, .early = 2}, {.halves = 2, .early = 0, .pdl = false},
      {.halves = 4, .early = 2}};
  // Knock-outs (wrong results, timing only): what each part of the kernel costs.
  const std::vector<Config> knockouts = {{.halves = 2, .mode = kNoFixup, .early = 16},
                                         {.halves = 4, .mode = kNoFixup, .early = 2},
                                         {.halves = 2, .mode = kNoFixup | kNoXAfterRing, .early = 16}};
  std::vector<char> text(1 << 16);
  FILE* summary = fmemopen(text.data(), text.size(), "w");
  bool all_correct = true;
  for (size_t j = 0; j < all.size(); ++j) {
    const Shape& s = kShapes[j];
    for (int nr : {8, 16, 32, 64}) {
      for (int rows : {nr - 3, nr}) {
        if (rows < 3) continue;
        const double bytes = 2.0 * static_cast<double>(s.in * s.out) + 2.0 * rows * (s.in + s.out);
        const auto pct = [&](double us) { return 100.0 * bytes / us / 1e3 / copy; };
        Config best_c{};
        double best = 1e30, cublas = 0.0;
        std::vector<Config> runs = configs;
        if (rows == nr && (nr == 8 || nr == 32)) runs.insert(runs.end(), knockouts.begin(), knockouts.end());
        for (const Config& c : runs) {
          if (c.halves == 4 && nr > 32) continue;
          double diff = 0.0;
          bool ok = true;
          if (c.mode == 0) {
            diff = check(s, *all[j], rows, nr, c, ctx, stream);
            // bf16 output rounding (2^-9 relative) and a different summation order: 1e-2 of the largest value.
            ok = diff >= 0.0 && diff < 1e-2;
            all_correct = all_correct && ok;
          }
          const Timing t = time_shape(s, *all[j], rows, nr, c, ctx, stream, iters);
          std::printf("%-8s %2d rows (n%2d) %-40s cuBLASLt %8.2f us %5.1f%%  wgmma %8.2f us %5.1f%%  %+6.1f%%"
                      "  diff %.2e %s\n",
                      s.name, rows, nr, describe(c), t.cublas_us, pct(t.cublas_us), t.ours_us, pct(t.ours_us),
                      100.0 * (t.cublas_us / t.ours_us - 1.0), diff, c.mode ? "knock-out" : ok ? "ok" : "WRONG");
          if (c.mode == 0 && t.ours_us < best) best = t.ours_us, best_c = c, cublas = t.cublas_us;
        }
        std::fprintf(summary, "%-8s %2d rows  cuBLASLt %8.2f us %5.1f%%  wgmma %8.2f us %5.1f%% (%s)  %+6.1f%%\n",
                     s.name, rows, cublas, pct(cublas), best, pct(best), describe(best_c),
                     100.0 * (cublas / best - 1.0));
      }
    }
  }
  for (int nr : {8, 16, 32, 64})
    for (const Config& c : configs) {
      if (c.halves == 4 && nr > 32) continue;
      const Timing t = time_layer(all, nr, nr, c, ctx, stream, iters);
      std::fprintf(summary, "layer    %2d rows  cuBLASLt %8.2f us  wgmma %8.2f us (%s)  %+6.1f%%\n", nr, t.cublas_us,
                   t.ours_us, describe(c), 100.0 * (t.cublas_us / t.ours_us - 1.0));
    }
  std::fclose(summary);
  std::printf("\nsummary (copy %.0f GB/s)%s\n%s", copy, all_correct ? "" : "  SOME RESULTS WRONG", text.data());
  for (auto* b : all) delete b;
  return all_correct ? 0 : 1;
}
