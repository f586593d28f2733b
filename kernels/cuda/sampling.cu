// Sampling (the rule of kernels/sampling.h) with one 512-thread block per
// row and no scratch beyond shared memory. The row is scanned several
// times (it stays in L2):
//   the first column of the order: a block max over (key, lowest column);
//   top-k: a radix selection (four 8-bit digits of the key, per-warp
//     histograms in shared memory) of the k-th key, then an index-order scan
//     for the last kept column among those with that key;
//   the top-k weight sum: a block sum of 64-bit integers;
//   top-p: the same selection over weights instead of counts;
//   the draw: an index-order scan (tiles of 8 consecutive columns per
//     thread, block prefix sums) for the column where the kept weight
//     passes u.
// Every sum is an integer sum, so the order of the additions cannot change
// the result, and the weights come from sampling_math.h as on the host.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"
#include "kernels/sampling_math.h"

namespace lockstep::cuda {

namespace {

constexpr int kSampleThreads = 512;
constexpr int kWarps = kSampleThreads / 32;
constexpr int kScanItems = 8;  // consecutive columns per thread in the index-order scans
constexpr int kDigitBits = 8;
constexpr int kDigits = 1 << kDigitBits;

// One row of the logits, read through the shard layout of SampleParams.
template <typename T>
struct RowView {
  const T* logits;
  int64_t rows, cols, shards, row;
  __device__ uint32_t key(int64_t col) const {
    return sampling::order_key(to_float(logits[sampling::logit_index(row, col, rows, cols, shards)]));
  }
};

// The kept columns: a key above `key`, or equal to it at a column up to `last`.
struct Cut {
  uint32_t key;
  int64_t last;
  __device__ bool keeps(int64_t col, uint32_t k) const { return k > key || (k == key && col <= last); }
};

__device__ __forceinline__ uint64_t warp_reduce(uint64_t v, bool take_max) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, v, o);
    v = take_max ? (other > v ? other : v) : v + other;
  }
  return v;
}

// Sum (or max) over the block; every thread gets it.
__device__ uint64_t block_reduce(uint64_t v, bool take_max) {
  __shared__ uint64_t partial[kWarps];
  v = warp_reduce(v, take_max);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t r = partial[0];
  for (int w = 1; w < kWarps; ++w) r = take_max ? (partial[w] > r ? partial[w] : r) : r + partial[w];
  __syncthreads();  // partial is free for the next call
  return r;
}

// Inclusive prefix sum in thread order; *total gets the block's sum.
__device__ uint64_t block_inclusive_scan(uint64_t v, uint64_t* total) {
  __shared__ uint64_t warp_totals[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t before = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += before;
  }
  if (lane == 31) warp_totals[warp] = v;
  __syncthreads();
  uint64_t earlier = 0, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) earlier += warp_totals[w];
    sum += warp_totals[w];
  }
  __syncthreads();
  *total = sum;
  return earlier + v;
}

// The first column, in index order, at which the running sum of f(column)
// exceeds `target`; -1 when the whole row sums to at most target. Each tile
// gives every thread kScanItems consecutive columns.
template <typename F>
__device__ int64_t first_column_past(int64_t n, uint64_t target, F f) {
  __shared__ int64_t found;
  uint64_t carry = 0;
  for (int64_t base = 0; base < n; base += static_cast<int64_t>(kSampleThreads) * kScanItems) {
    const int64_t begin = base + static_cast<int64_t>(threadIdx.x) * kScanItems;
    uint64_t mine = 0;
    for (int j = 0; j < kScanItems && begin + j < n; ++j) mine += f(begin + j);
    uint64_t total;
    const uint64_t through_mine = carry + block_inclusive_scan(mine, &total);
    if (carry + total > target) {  // the same decision in every thread
      uint64_t running = through_mine - mine;
      if (running <= target && target < through_mine) {  // exactly one thread
        for (int j = 0; j < kScanItems && begin + j < n; ++j) {
          running += f(begin + j);
          if (running > target) {
            found = begin + j;
            break;
          }
        }
      }
      __syncthreads();
      const int64_t result = found;
      __syncthreads();
      return result;
    }
    carry += total;
  }
  return -1;
}

// The radix selection's per-warp digit histograms (32 KiB), declared once so
// that every instantiation of select_threshold shares them.
__device__ uint64_t (*radix_histograms())[kDigits] {
  __shared__ uint64_t histograms[kWarps][kDigits];  // per warp: fewer colliding atomics
  return histograms;
}

struct Threshold {
  uint32_t key;    // where the running sum, in descending key order, reaches the target
  uint64_t above;  // the sum over larger keys (below the target)
};

// Radix selection: the key at which the sum of g(column, key) over the
// columns in descending key order first reaches `target` (at most the total).
template <typename T, typename G>
__device__ Threshold select_threshold(const RowView<T>& row, int64_t n, uint64_t target, G g) {
  uint64_t(*histogram)[kDigits] = radix_histograms();
  __shared__ Threshold chosen;
  uint32_t prefix = 0, mask = 0;
  uint64_t above = 0;
  for (int shift = 32 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    for (int i = threadIdx.x; i < kWarps * kDigits; i += kSampleThreads) histogram[i / kDigits][i % kDigits] = 0;
    __syncthreads();
    uint64_t* mine = histogram[threadIdx.x / 32];
    for (int64_t c = threadIdx.x; c < n; c += kSampleThreads) {
      const uint32_t key = row.key(c);
      if ((key & mask) != prefix) continue;
      const uint64_t v = g(c, key);
      if (v != 0) atomicAdd(reinterpret_cast<unsigned long long*>(&mine[(key >> shift) & (kDigits - 1)]), v);
    }
    __syncthreads();
    if (threadIdx.x < kDigits) {
      uint64_t s = 0;
      for (int w = 0; w < kWarps; ++w) s += histogram[w][threadIdx.x];
      histogram[0][threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int d = kDigits - 1;
      while (d > 0 && above + histogram[0][d] < target) above += histogram[0][d--];
      chosen = Threshold{prefix | (static_cast<uint32_t>(d) << shift), above};
    }
    __syncthreads();
    prefix = chosen.key;
    above = chosen.above;
    mask |= static_cast<uint32_t>(kDigits - 1) << shift;
    __syncthreads();  // chosen and the histograms are rewritten next round
  }
  return Threshold{prefix, above};
}

// Top-k as a cut: the k-th key and, among the columns with that key, the
// last kept one (all columns when top_k is 0 or at least n).
template <typename T>
__device__ Cut top_k_cut(const RowView<T>& row, int64_t n, int64_t top_k) {
  if (top_k <= 0 || top_k >= n) return Cut{0, n - 1};
  const Threshold t = select_threshold(row, n, static_cast<uint64_t>(top_k), [](int64_t, uint32_t) { return 1ull; });
  const uint64_t ties_kept = static_cast<uint64_t>(top_k) - t.above;
  const int64_t last = first_column_past(n, ties_kept - 1, [&](int64_t c) { return row.key(c) == t.key ? 1ull : 0ull; });
  return Cut{t.key, last};
}

struct Nucleus {
  Cut cut;
  uint64_t mass;  // the kept weight
};

// Top-p within the top-k cut: the shortest prefix of the order whose weight
// reaches the nucleus mass, as a cut on the key and the last tied column.
template <typename T, typename W>
__device__ Nucleus top_p_cut(const RowView<T>& row, int64_t n, Cut top_k, float top_p, W weight) {
  uint64_t local = 0;
  for (int64_t c = threadIdx.x; c < n; c += kSampleThreads) {
    const uint32_t key = row.key(c);
    if (top_k.keeps(c, key)) local += weight(key);
  }
  const uint64_t top_k_mass = block_reduce(local, false);
  const uint64_t wanted = sampling::nucleus_mass(top_k_mass, top_p);
  if (wanted >= top_k_mass) return Nucleus{top_k, top_k_mass};
  auto kept_weight = [&](int64_t c, uint32_t key) { return top_k.keeps(c, key) ? weight(key) : 0ull; };
  const Threshold t = select_threshold(row, n, wanted, kept_weight);
  const uint64_t tie_weight = weight(t.key);  // > 0: the selection stopped on weight
  const uint64_t ties_kept = (wanted - t.above + tie_weight - 1) / tie_weight;
  const int64_t last = first_column_past(n, ties_kept - 1, [&](int64_t c) {
    const uint32_t key = row.key(c);
    return key == t.key && top_k.keeps(c, key) ? 1ull : 0ull;
  });
  return Nucleus{Cut{t.key, last}, t.above + ties_kept * tie_weight};
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads, 1) sample_kernel(SampleParams p) {
  start_after_producers();
  const RowView<T> row{static_cast<const T*>(p.logits), p.rows, p.cols, p.shards, blockIdx.x};
  const SampleRow s = p.settings[blockIdx.x];
  const int64_t n = p.valid_cols;
  // The first column of the order: the largest key, then the lowest column.
  uint64_t best = 0;
  for (int64_t c = threadIdx.x; c < n; c += kSampleThreads) {
    const uint64_t candidate = (static_cast<uint64_t>(row.key(c)) << 32) | (0xffffffffu - static_cast<uint32_t>(c));
    best = candidate > best ? candidate : best;
  }
  best = block_reduce(best, true);
  if (s.temperature == 0.0f) {
    if (threadIdx.x == 0) p.ids[blockIdx.x] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
    return;
  }
  const float max_logit = sampling::key_value(static_cast<uint32_t>(best >> 32));
  auto weight = [&](uint32_t key) { return sampling::weight(sampling::key_value(key), max_logit, s.temperature); };
  const Nucleus nucleus = top_p_cut(row, n, top_k_cut(row, n, s.top_k), s.top_p, weight);
  const uint64_t u = sampling::draw(s.random, nucleus.mass);
  const int64_t id = first_column_past(n, u, [&](int64_t c) {
    const uint32_t key = row.key(c);
    return nucleus.cut.keeps(c, key) ? weight(key) : 0ull;
  });
  if (threadIdx.x == 0) p.ids[blockIdx.x] = static_cast<int32_t>(id);
}

}  // namespace

void sample(const SampleParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  dispatch_dtype(p.dtype, "sample", [&](auto t) {
    using T = decltype(t);
    LS_LAUNCH("sample_kernel", sample_kernel<T>, dim3(static_cast<unsigned>(p.rows)), dim3(kSampleThreads), 0, stream,
              p);
  });
}

}  // namespace lockstep::cuda
