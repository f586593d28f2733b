// Experiment: products of 1-64 rows on the tensor cores whose weights are
// stored in mma fragment order, against cuda::linear (our GEMV at 1-2
// rows, cuBLASLt from 3) on the llama3-8b layer shapes; no engine path uses
// it (benchmarks/RESULTS.md and NOTES.md, twenty-seventh session). The ninth
// session's own product (v4) held W in registers in fragment order but read
// it from the checkpoint's row-major layout, so each load instruction took
// half a 128-byte line of 8 rows and DRAM served it at ~81%; it concluded
// that fragment order and whole lines exclude each other. They do not if the
// weights are repacked once: a warp's rounds are contiguous 4 KB runs (8
// loads of 16 bytes a lane, two rounds in flight: weight_stream_bench's
// pattern, which reaches the copy bandwidth), each lane's 16 bytes exactly
// its A fragment of one m16n8k16 tile.
//
// y = x·Wᵀ, x [rows <= 64, K] bf16 row-major, W [N, K] bf16. Swapped
// operands: A = a 16-feature tile of W (registers, straight from DRAM),
// B = x's 8-row tiles read from the row-major input through L1 (k is
// permuted inside each 64-wide group so that a lane's B fragments of four k
// blocks are 32 contiguous bytes of its row; W is packed in the same k
// order), D = 16 features x 8 rows in float32. A warp owns a pair of
// 16-feature blocks and one of B x G k slices (whole rounds, as even as
// they divide): B warps of a block, summed through shared memory in warp
// order, times G blocks, whose float32 partials the pair's last block to
// arrive sums in slice order (deterministic both) and stores. "+silu" pairs
// 16 gate with the matching 16 up features and stores SiLU(gate)·up,
// against cuBLASLt plus the SiLU·mul kernel. Packed weight layout:
// [feature pair][k block of 16][block of the pair][lane][8 values].
// Each split runs twice: from the packed weights, and ("rows") from W as
// stored, read in the same fragment order (load_round_rows), which needs no
// packing but gives a warp 32 rows x 128 bytes a round instead of one 4 KB
// run (7-14% slower: RESULTS.md, twenty-eighth session).
// Prints every split at 1, 8, 16, 32 and 64 rows, then a summary: the
// fastest split of each layout against cuda::linear, % of the copy
// bandwidth, and the largest difference from its output relative to its
// largest value.
// Run: build/packed_product_bench [iterations]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/mma.cuh"

namespace {

using lockstep::DType;
using lockstep::bench::download_bf16;
using lockstep::bench::fill_random;
using lockstep::bench::load_streaming;

constexpr int kMaxRows = 64;  // 8 n-tiles of 8
constexpr int kRound = 4;     // k blocks of 16 a round: 4 x 2 tiles x 512 B = 4 KB a warp

// The k order: within each 64-wide k group, lane c (= lane % 4) of an
// 8-row n-tile reads x's 16 contiguous values at 16c (two 16-byte loads of
// the row-major input) and uses values 4j..4j+3 as its B fragment of the
// group's k block j. A fragment position p (0-15) of k block kb is then x's
// (and W's) column:
__host__ __device__ inline int64_t physical_k(int64_t kb, int p) {
  const int c = (p % 8) / 2, hi = p / 8, within = p % 2;
  return 64 * (kb / 4) + 16 * c + 4 * (kb % 4) + 2 * hi + within;
}

// W [N, K] row-major -> [feature pair][k block][block of the pair][lane][8].
// silu_pairs: pair p is gate features 16p.. and up features inter + 16p..
// (N = 2 inter), so that one warp holds both halves of its 16 outputs.
__global__ void pack_weights(const __nv_bfloat16* w, __nv_bfloat16* packed, int64_t n, int64_t k, bool silu_pairs) {
  const int64_t kb_count = k / 16, groups = n / 32 * kb_count * 2 * 32;
  for (int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; g < groups; g += int64_t{gridDim.x} * blockDim.x) {
    const int lane = static_cast<int>(g % 32);
    const int half = static_cast<int>(g / 32 % 2);
    const int64_t kb = g / 64 % kb_count, pair = g / 64 / kb_count;
    const int64_t first = silu_pairs ? half * (n / 2) + pair * 16 : pair * 32 + half * 16;
    for (int e = 0; e < 8; ++e) {
      const int64_t row = first + lane / 4 + (e / 2 % 2) * 8;
      packed[g * 8 + e] = w[row * k + physical_k(kb, 2 * (lane % 4) + e % 2 + (e / 4) * 8)];
    }
  }
}

// The project's m16n8k16 on a lane's 16 bytes of A.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  const uint32_t fragment[4] = {a.x, a.y, a.z, a.w};
  lockstep::cuda::mma_16816<__nv_bfloat16>(d, fragment, b0, b1);
}

// A round's weights: kRound k blocks of both blocks of the pair, 16 bytes a lane each.
__device__ __forceinline__ void load_round(uint4 (&a)[kRound][2], const uint4* wp, int64_t kb) {
#pragma unroll
  for (int b = 0; b < kRound; ++b)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      a[b][h] = load_streaming(reinterpret_cast<const unsigned char*>(wp + (kb + b) * 64 + h * 32));
}

// The same round from W as it is stored (row-major, no packing): lane (g, c)
// reads bytes [32c, 32c + 32) of the round's 64-k group in rows g and g + 8
// of each block of the pair, a[0..1][h] from row g and a[2..3][h] from row
// g + 8. Those are the k that x's B fragments of the group's four k blocks
// take (physical_k), so block j's A fragment is words 2j and 2j + 1 of both
// rows (fragment<true>); no data moves between lanes.
__device__ __forceinline__ void load_round_rows(uint4 (&a)[kRound][2], const __nv_bfloat16* const (&row)[2],
                                                int64_t k, int64_t kb) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const auto* r = reinterpret_cast<const unsigned char*>(row[h] + kb * 16);
    a[0][h] = load_streaming(r), a[1][h] = load_streaming(r + 16);
    a[2][h] = load_streaming(r + 16 * k), a[3][h] = load_streaming(r + 16 * k + 16);
  }
}

template <bool RowMajor>
__device__ __forceinline__ uint4 fragment(const uint4 (&a)[kRound][2], int j, int h) {
  if constexpr (!RowMajor) return a[j][h];
  const uint4 &g = a[j / 2][h], &g8 = a[2 + j / 2][h];
  return j % 2 == 0 ? make_uint4(g.x, g8.x, g.y, g8.y) : make_uint4(g.z, g8.z, g.w, g8.w);
}

// The round's products: per n-tile, the lane's 32 bytes of its x row (zeros past the rows).
template <int NT, bool RowMajor>
__device__ __forceinline__ void mma_round(float (&acc)[2][NT][4], const uint4 (&a)[kRound][2],
                                          const __nv_bfloat16* x_lane, int64_t ld, int rows, int64_t kb) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    uint4 x0 = make_uint4(0, 0, 0, 0), x1 = x0;
    if (t * 8 + lane / 4 < rows) {
      const uint4* q = reinterpret_cast<const uint4*>(x_lane + t * 8 * ld + kb * 16);
      x0 = __ldg(q), x1 = __ldg(q + 1);
    }
    const uint32_t bx[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
    for (int j = 0; j < kRound; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) mma_bf16(acc[h][t], fragment<RowMajor>(a, j, h), bx[2 * j], bx[2 * j + 1]);
  }
}

struct PackedArgs {
  const uint4* w;           // packed weights
  const __nv_bfloat16* w_rows;  // or W as stored ([n, k] row-major), when w is null
  const __nv_bfloat16* x;   // [rows, k] row-major
  __nv_bfloat16* y;         // [rows, n], or [rows, n / 2] with silu
  float* partial;           // [grid_slices, 32, n] (grid_slices > 1)
  int* arrivals;            // [n / 32], zero between launches (grid_slices > 1)
  int64_t n, k;
  int rows;
  int block_slices;  // k slices of one pair inside a block, summed through shared memory
  int grid_slices;   // of those, slices over blocks, summed by the pair's last block
};

// The warp's 16 outputs of each n-tile row it holds, from float sums:
// plain (32 features) or SiLU(gate)·up (16).
template <int NT, bool Silu>
__device__ __forceinline__ void store_outputs(const PackedArgs& p, int64_t pair, const float (&sum)[2][NT][4]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int row = t * 8 + 2 * (lane % 4) + c % 2;
      if (row >= p.rows) continue;
      const int64_t f = lane / 4 + (c / 2) * 8;
      if constexpr (Silu) {
        const float g = sum[0][t][c], u = sum[1][t][c];
        p.y[row * (p.n / 2) + pair * 16 + f] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) p.y[row * p.n + pair * 32 + h * 16 + f] = __float2bfloat16(sum[h][t][c]);
      }
    }
}

// The pair's k range [kb0, kb0 + count) of slice `slice` of `slices`: whole rounds, as even as they divide.
__device__ __forceinline__ void slice_range(int64_t kb_count, int slice, int slices, int64_t& kb0, int64_t& count) {
  const int64_t rounds = kb_count / kRound;
  kb0 = slice * rounds / slices * kRound;
  count = (slice + 1) * rounds / slices * kRound - kb0;
}

// A warp's k slice of its pair: two rounds in flight, from the packed
// weights or (RowMajor) from W as stored, rows of the pair as pack_weights
// pairs them (silu_pairs: gate block h = 0, up block h = 1).
template <int NT, bool RowMajor, bool Silu>
__device__ __forceinline__ void stream_slice(const PackedArgs& p, int64_t pair, int64_t kb0, int64_t count,
                                             float (&acc)[2][NT][4]) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const uint4* wp = p.w + (pair * (p.k / 16) + kb0) * 64 + lane;
  const __nv_bfloat16* row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t first = Silu ? h * (p.n / 2) + pair * 16 : pair * 32 + h * 16;
    row[h] = p.w_rows + (first + lane / 4) * p.k + kb0 * 16 + 16 * (lane % 4);
  }
  const auto load = [&](uint4 (&a)[kRound][2], int64_t kb) {
    if constexpr (RowMajor) load_round_rows(a, row, p.k, kb);
    else load_round(a, wp, kb);
  };
  const __nv_bfloat16* x_lane = p.x + (lane / 4) * p.k + kb0 * 16 + 16 * (lane % 4);
  uint4 a0[kRound][2], a1[kRound][2];
  load(a0, 0);
  for (int64_t kb = 0; kb < count; kb += 2 * kRound) {
    if (kb + kRound < count) load(a1, kb + kRound);
    mma_round<NT, RowMajor>(acc, a0, x_lane, p.k, p.rows, kb);
    if (kb + kRound >= count) break;
    if (kb + 2 * kRound < count) load(a0, kb + 2 * kRound);
    mma_round<NT, RowMajor>(acc, a1, x_lane, p.k, p.rows, kb + kRound);
  }
}

// Blocks of blockDim.x / 32 warps: block_slices warps a pair, so
// (warps / block_slices) pairs a block, at one grid slice. The pair's warps
// sum through shared memory in warp order; with grid_slices > 1 the first
// warp writes float partials and the pair's last block to arrive sums all
// grid slices in slice order (the same result whatever the arrival order).
// Registers: 128 a thread up to 2 n-tiles (16 warps an SM), 168 for 4 (12),
// 255 for 8 (8).
constexpr int max_threads(int n_tiles) { return n_tiles <= 2 ? 512 : n_tiles == 4 ? 384 : 256; }

template <int NT, bool Silu, bool RowMajor>
__global__ void __launch_bounds__(max_threads(NT), 1) packed_product(PackedArgs p) {
  extern __shared__ float shared_sums[];  // [warp][2 * NT * 4][lane]
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int pairs_per_block = static_cast<int>(blockDim.x / 32) / p.block_slices;
  const int64_t pairs = p.n / 32, pair_groups = (pairs + pairs_per_block - 1) / pairs_per_block;
  const int grid_slice = static_cast<int>(blockIdx.x / pair_groups);
  const int64_t pair = blockIdx.x % pair_groups * pairs_per_block + warp / p.block_slices;
  const int in_block = warp % p.block_slices;
  float acc[2][NT][4] = {};
  if (pair < pairs) {
    int64_t kb0, count;
    slice_range(p.k / 16, grid_slice * p.block_slices + in_block, p.grid_slices * p.block_slices, kb0, count);
    stream_slice<NT, RowMajor, Silu>(p, pair, kb0, count, acc);
  }
  if (p.block_slices > 1) {
    float* mine = shared_sums + warp * (2 * NT * 4) * 32 + lane;
#pragma unroll
    for (int e = 0; e < 2 * NT * 4; ++e) mine[e * 32] = (&acc[0][0][0])[e];
    __syncthreads();
    if (in_block != 0) return;
#pragma unroll
    for (int e = 0; e < 2 * NT * 4; ++e) {
      float sum = 0.0f;
      for (int j = 0; j < p.block_slices; ++j) sum += mine[(j * (2 * NT * 4) + e) * 32];
      (&acc[0][0][0])[e] = sum;
    }
  }
  if (pair >= pairs) return;
  if (p.grid_slices == 1) return store_outputs<NT, Silu>(p, pair, acc);
  // D fragment: c0,c1 at (feature lane/4, rows 2(lane%4)+{0,1}); c2,c3 at feature + 8.
  const auto at = [&](int s, int h, int t, int c) {
    return p.partial + (static_cast<int64_t>(s) * kMaxRows + t * 8 + 2 * (lane % 4) + c % 2) * p.n + pair * 32 +
           h * 16 + lane / 4 + (c / 2) * 8;
  };
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) *at(grid_slice, h, t, c) = acc[h][t][c];
  __threadfence();
  int arrived = 0;
  if (lane == 0) arrived = atomicAdd(p.arrivals + pair, 1);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived != p.grid_slices - 1) return;
  __threadfence();
  // A slice's 2 x NT x 4 loads are independent and in flight together.
  float sum[2][NT][4] = {};
  for (int s = 0; s < p.grid_slices; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int c = 0; c < 4; ++c) sum[h][t][c] += s == grid_slice ? acc[h][t][c] : __ldcg(at(s, h, t, c));
  if (lane == 0) p.arrivals[pair] = 0;  // ready for the next launch
  store_outputs<NT, Silu>(p, pair, sum);
}

struct Shape {
  const char* name;
  int64_t in, out;
  bool silu = false;
};
constexpr Shape kShapes[] = {{"qkv", 4096, 6144},
                             {"o_proj", 4096, 4096},
                             {"gate_up", 4096, 28672},
                             {"gate_up+silu", 4096, 28672, true},
                             {"down", 14336, 4096}};

// Blocks of max(4, block_slices) warps; W as stored when a.w is null.
template <int NT, bool Silu, bool RowMajor>
void launch_layout(const PackedArgs& a, cudaStream_t stream) {
  const int warps = std::max(4, a.block_slices), pairs_per_block = warps / a.block_slices;
  const int64_t pair_groups = (a.n / 32 + pairs_per_block - 1) / pairs_per_block;
  const int shared = a.block_slices > 1 ? warps * 2 * NT * 4 * 32 * 4 : 0;
  static bool configured = false;
  if (!configured) {
    LS_CHECK_CUDA(cudaFuncSetAttribute(packed_product<NT, Silu, RowMajor>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, 65536));
    configured = true;
  }
  packed_product<NT, Silu, RowMajor>
      <<<static_cast<unsigned>(pair_groups * a.grid_slices), warps * 32, shared, stream>>>(a);
}

template <int NT, bool Silu>
void launch_packed(const PackedArgs& a, cudaStream_t stream) {
  a.w == nullptr ? launch_layout<NT, Silu, true>(a, stream) : launch_layout<NT, Silu, false>(a, stream);
}

template <bool Silu>
void launch_packed(const PackedArgs& a, cudaStream_t stream) {
  const int nt = (a.rows + 7) / 8;
  if (nt == 1) return launch_packed<1, Silu>(a, stream);
  if (nt == 2) return launch_packed<2, Silu>(a, stream);
  if (nt <= 4) return launch_packed<4, Silu>(a, stream);
  launch_packed<8, Silu>(a, stream);
}

void launch_packed(const PackedArgs& a, bool silu, cudaStream_t stream) {
  silu ? launch_packed<true>(a, stream) : launch_packed<false>(a, stream);
}

// Buffers of one shape: weight copies cycled so that L2 cannot serve them, packed copies, x, outputs.
struct ShapeBuffers {
  std::vector<__nv_bfloat16*> w, wp;
  __nv_bfloat16 *x = nullptr, *y_ref = nullptr, *gate_up = nullptr, *y = nullptr;
  float* partial = nullptr;
  int* arrivals = nullptr;
  static constexpr int kMaxSlices = 16;
  ShapeBuffers(const Shape& s, cudaStream_t stream) {
    const int64_t bytes = 2 * s.in * s.out;
    const int64_t copies = std::max<int64_t>(2, ((int64_t{256} << 20) + bytes - 1) / bytes);
    for (int64_t c = 0; c < copies; ++c) {
      w.push_back(nullptr), wp.push_back(nullptr);
      LS_CHECK_CUDA(cudaMalloc(&w.back(), bytes));
      LS_CHECK_CUDA(cudaMalloc(&wp.back(), bytes));
      fill_random<<<1024, 256, 0, stream>>>(w.back(), s.in * s.out, 17 + static_cast<uint32_t>(c), 0.03f);
      pack_weights<<<1024, 256, 0, stream>>>(w.back(), wp.back(), s.out, s.in, s.silu);
    }
    LS_CHECK_CUDA(cudaMalloc(&x, 2 * kMaxRows * s.in));
    LS_CHECK_CUDA(cudaMalloc(&y_ref, 2 * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&gate_up, 2 * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&y, 2 * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&partial, 4 * kMaxSlices * kMaxRows * s.out));
    LS_CHECK_CUDA(cudaMalloc(&arrivals, 4 * s.out / 32));
    LS_CHECK_CUDA(cudaMemsetAsync(arrivals, 0, 4 * s.out / 32, stream));
    fill_random<<<256, 256, 0, stream>>>(x, kMaxRows * s.in, 5, 1.0f);
    LS_CHECK_CUDA(cudaGetLastError());
  }
  ~ShapeBuffers() {
    for (size_t c = 0; c < w.size(); ++c) cudaFree(w[c]), cudaFree(wp[c]);
    for (void* b : {static_cast<void*>(x), static_cast<void*>(y_ref), static_cast<void*>(gate_up),
                    static_cast<void*>(y), static_cast<void*>(partial), static_cast<void*>(arrivals)})
      cudaFree(b);
  }
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;
};

// cuBLASLt (with the SiLU·mul kernel for +silu) and the packed product at
// each split count, at `rows` rows; the full table to stdout, one summary
// line (cuBLASLt, the best split) to `summary`.
void bench_rows(const Shape& s, const ShapeBuffers& b, int rows, lockstep::cuda::LinearContext& ctx,
                cudaStream_t stream, int iters, double copy, FILE* summary) {
  const int copies = static_cast<int>(b.w.size()), per_graph = std::max(copies, 8);
  const int64_t out = s.silu ? s.out / 2 : s.out;
  lockstep::LinearParams p{.x = b.x, .weight = b.w[0], .y = s.silu ? b.gate_up : b.y_ref, .rows = rows,
                           .in_features = s.in, .out_features = s.out, .act_dtype = DType::kBF16,
                           .weight_dtype = DType::kBF16};
  if (s.silu)
    p.silu_mul = lockstep::SiluMulParams{.gate_up = b.gate_up, .out = b.y_ref, .rows = rows, .inter = s.out / 2,
                                         .dtype = DType::kBF16};
  lockstep::cuda::linear(p, ctx, stream);
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  const std::vector<float> want = download_bf16(b.y_ref, rows * out);
  const double cublas_us = lockstep::bench::graphed_us(stream, per_graph, iters, [&](int i) {
    p.weight = b.w[static_cast<size_t>(i % copies)];
    lockstep::cuda::linear(p, ctx, stream);
  });
  const double bytes = 2.0 * static_cast<double>(s.in * s.out + rows * (s.in + out));
  const auto pct = [&](double us) { return 100.0 * bytes / us / 1e3 / copy; };
  std::printf("%-12s %2d rows linear%s %8.2f us %5.1f%%\n", s.name, rows, s.silu ? "+silu_mul" : "", cublas_us,
              pct(cublas_us));
  std::vector<std::pair<int, int>> splits;  // (block slices, grid slices)
  for (int g = 1; g <= 16; ++g) splits.push_back({1, g});
  for (int b : {2, 4, 8, 16}) splits.push_back({b, 1});
  for (int g : {2, 3, 4}) splits.push_back({4, g});
  for (int g : {2, 3}) splits.push_back({8, g});
  for (const bool row_major : {false, true}) {
    const char* layout = row_major ? "rows  " : "packed";
    double best = 1e30, best_diff = 0.0;
    std::pair<int, int> best_split{0, 0};
    for (const auto& [block_slices, grid_slices] : splits) {
      if (rows > 16 && block_slices > 8) continue;  // 12 or 8 warps a block at most
      PackedArgs a{.w = nullptr, .w_rows = nullptr, .x = b.x, .y = b.y, .partial = b.partial,
                   .arrivals = b.arrivals, .n = s.out, .k = s.in, .rows = rows, .block_slices = block_slices,
                   .grid_slices = grid_slices};
      const auto product = [&](int i) {
        PackedArgs launch = a;
        const auto c = static_cast<size_t>(i % copies);
        if (row_major)
          launch.w_rows = b.w[c];
        else
          launch.w = reinterpret_cast<const uint4*>(b.wp[c]);
        launch_packed(launch, s.silu, stream);
      };
      LS_CHECK_CUDA(cudaMemsetAsync(b.y, 0, 2 * kMaxRows * s.out, stream));
      product(0);
      LS_CHECK_CUDA(cudaGetLastError());
      LS_CHECK_CUDA(cudaStreamSynchronize(stream));
      const std::vector<float> got = download_bf16(b.y, rows * out);
      double worst = 0.0, scale = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
      }
      const double us = lockstep::bench::graphed_us(stream, per_graph, iters, product);
      std::printf("%-12s %2d rows %s B x G %2d x %-2d warps %6lld %8.2f us %5.1f%%  max|diff|/max %.2e\n", s.name,
                  rows, layout, block_slices, grid_slices,
                  static_cast<long long>(s.out / 32 * block_slices * grid_slices), us, pct(us), worst / scale);
      if (us < best) best = us, best_split = {block_slices, grid_slices}, best_diff = worst / scale;
    }
    std::fprintf(summary,
                 "%-12s %2d rows  linear %8.2f us %5.1f%%  %s B x G %2d x %-2d %8.2f us %5.1f%%  %+6.1f%%"
                 "  diff %.1e\n",
                 s.name, rows, cublas_us, pct(cublas_us), layout, best_split.first, best_split.second, best,
                 pct(best), 100.0 * (cublas_us / best - 1.0), best_diff);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int sms = 0;
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const double copy = lockstep::bench::copy_gbs(stream);
  std::printf("copy bandwidth %.0f GB/s; %d SMs\n", copy, sms);
  lockstep::cuda::LinearContext ctx;
  std::vector<char> text(1 << 16);
  FILE* summary = fmemopen(text.data(), text.size(), "w");
  for (const Shape& s : kShapes) {
    const ShapeBuffers b(s, stream);
    for (int rows : {1, 8, 16, 32, 64}) bench_rows(s, b, rows, ctx, stream, iters, copy, summary);
  }
  std::fclose(summary);
  std::printf("\nsummary (copy %.0f GB/s): the fastest split against cuda::linear\n%s", copy, text.data());
  return 0;
}
