// Sampling (the rule of kernels/sampling.h). A row is sampled by a group of
// blocks, a thread-block cluster of 8 on sm_90 and later (one block on older
// GPUs), each block owning a contiguous slice of the row's columns; the
// blocks exchange partial sums, histograms and scan carries through
// distributed shared memory, and nothing else needs scratch memory. Each
// pass reads the slice again (the row stays in L2), 16 bytes per load where
// the layout allows, several loads in flight per thread:
//   the first column of the order: a max over (key, lowest column);
//   top-k: a radix selection of the k-th key (digits of 11, 11 and 10 bits
//     from the top, counts in per-block histograms that every block reads
//     whole), then an index-order scan for the last kept column among those
//     with that key;
//   the top-k weight sum, which also fills the first digit's histogram of
//     weights when top-p is on;
//   top-p: the other two digits of the same selection over weights, then
//     the index-order scan for the last kept tie;
//   the draw: the index-order scan for the column where the kept weight
//     passes u. A scan sums each slice first; the block whose slice holds
//     the target then scans it in tiles of 8 consecutive columns per thread.
// Every sum is an integer sum, so the order of the additions cannot change
// the result, and the weights come from sampling_math.h as on the host.
// A thread gathers its histogram adds for the few bins it hit last in
// registers: the leading digits of a row's keys mostly agree, and adds of
// a whole warp to one shared bin would serialize.
#include <cooperative_groups.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"
#include "kernels/sampling_math.h"

namespace lockstep::cuda {

namespace {

constexpr int kSampleThreads = 256;   // 512 would spill: the passes hold ~170 registers
constexpr int kWarps = kSampleThreads / 32;
constexpr int kMaxRowBlocks = 8;      // a portable cluster size
constexpr int64_t kSliceAlign = 64;   // columns: slices start on whole 16-byte vectors
constexpr int kScanItems = 8;         // consecutive columns per thread in the index-order scans
constexpr int kLoadsInFlight = 4;     // 16-byte loads per thread per step of a pass
constexpr int kRounds = 3;            // radix digits: bits 31-21, 20-10, 9-0 of the key
constexpr int kMaxBins = 1 << 11;
constexpr uint32_t kNoBin = 0xffffffffu;

__device__ __forceinline__ int digit_shift(int round) { return round == 0 ? 21 : round == 1 ? 10 : 0; }
__device__ __forceinline__ int digit_bins(int round) { return round == 2 ? 1 << 10 : 1 << 11; }

// The blocks that sample one row: a cluster (sm_90 and later) or one block.
struct RowGroup {
  int blocks;  // 1 .. kMaxRowBlocks
  int rank;    // this block's
  // A barrier over the group's threads that also makes their shared-memory
  // writes visible to one another.
  __device__ void sync() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (blocks > 1) {
      cooperative_groups::this_cluster().sync();
      return;
    }
#endif
    __syncthreads();
  }
  // `local` (a shared variable) of the group's block `r`.
  template <typename V>
  __device__ V* at(V* local, int r) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (blocks > 1) return cooperative_groups::this_cluster().map_shared_rank(local, r);
#endif
    return local;
  }
};

// Every block's `mine`, in rank order, to every thread of the group.
template <typename V>
__device__ void gather(const RowGroup& g, V mine, V (&all)[kMaxRowBlocks]) {
  __shared__ V slot;
  if (threadIdx.x == 0) slot = mine;
  g.sync();
#pragma unroll
  for (int r = 0; r < kMaxRowBlocks; ++r)
    if (r < g.blocks) all[r] = *g.at(&slot, r);
  g.sync();  // every block has read the slots before any writes its own again
}

// The key of element j of a 16-byte vector of T.
template <typename T>
__device__ __forceinline__ uint32_t element_key(const uint4& v, int j) {
  constexpr int kPerWord = static_cast<int>(4 / sizeof(T));
  const int w = j / kPerWord;
  const uint32_t word = w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
  if constexpr (kPerWord == 1) {
    return sampling::order_key(__uint_as_float(word));
  } else {
    const auto bits = static_cast<unsigned short>(j % 2 == 0 ? word : word >> 16);  // element 0 in the low half
    T value;
    __builtin_memcpy(&value, &bits, sizeof bits);
    return sampling::order_key(to_float(value));
  }
}

// One row of the logits, read through the shard layout of SampleParams, and
// this block's slice [lo, hi) of its n valid columns.
template <typename T>
struct RowView {
  const T* logits;
  int64_t rows, cols, shards, row, n, lo, hi;

  __device__ uint32_t key(int64_t col) const {
    // shards · cols < 2^31 (SampleParams::validate): 32-bit division.
    const int64_t shard = shards == 1 ? 0 : static_cast<uint32_t>(col) / static_cast<uint32_t>(cols);
    return sampling::order_key(to_float(logits[(shard * rows + row) * cols + (col - shard * cols)]));
  }

  // Calls f(column, key) once for every column of the slice, spread over
  // the block's threads in no particular order.
  template <typename F>
  __device__ __forceinline__ void for_each(F f) const {
    constexpr int kVec = kVec16<T>;
    constexpr int64_t kStep = int64_t{kSampleThreads} * kLoadsInFlight;
    for (int64_t s = lo / cols; s < shards && s * cols < hi; ++s) {
      const int64_t first = max(lo, s * cols), len = min(hi, (s + 1) * cols) - first;
      const T* run = logits + (s * rows + row) * cols + (first - s * cols);
      const int64_t vectors = reinterpret_cast<uintptr_t>(run) % 16 == 0 ? len / kVec : 0;
      for (int64_t base = threadIdx.x; base < vectors; base += kStep) {
        uint4 v[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int64_t i = base + u * kSampleThreads;
          if (i < vectors) v[u] = *reinterpret_cast<const uint4*>(run + i * kVec);
        }
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int64_t i = base + u * kSampleThreads;
          if (i >= vectors) break;
#pragma unroll 1  // one copy of f per vector: the passes' bodies would not fit the instruction cache unrolled
          for (int j = 0; j < kVec; ++j) f(first + i * kVec + j, element_key<T>(v[u], j));
        }
      }
      for (int64_t c = vectors * kVec + threadIdx.x; c < len; c += kSampleThreads)
        f(first + c, sampling::order_key(to_float(run[c])));
    }
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

// Sum (or max) over the row's group of blocks; every thread gets it.
__device__ uint64_t row_reduce(const RowGroup& g, uint64_t v, bool take_max) {
  uint64_t all[kMaxRowBlocks];
  gather(g, block_reduce(v, take_max), all);
  uint64_t r = all[0];
#pragma unroll
  for (int b = 1; b < kMaxRowBlocks; ++b)
    if (b < g.blocks) r = take_max ? (all[b] > r ? all[b] : r) : r + all[b];
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

// The first column of the block's slice, in index order, at which the
// running sum of f(column, key) exceeds `target` (which the slice's sum
// does). Each tile gives every thread kScanItems consecutive columns.
template <typename T, typename F>
__device__ int64_t scan_slice(const RowView<T>& row, uint64_t target, F f) {
  __shared__ int64_t found;
  uint64_t carry = 0;
  for (int64_t base = row.lo; base < row.hi; base += static_cast<int64_t>(kSampleThreads) * kScanItems) {
    const int64_t begin = base + static_cast<int64_t>(threadIdx.x) * kScanItems;
    uint32_t keys[kScanItems];
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) keys[j] = begin + j < row.hi ? row.key(begin + j) : 0u;
    uint64_t values[kScanItems], mine = 0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      values[j] = begin + j < row.hi ? f(begin + j, keys[j]) : 0ull;
      mine += values[j];
    }
    uint64_t total;
    const uint64_t through_mine = carry + block_inclusive_scan(mine, &total);
    if (carry + total > target) {  // the same decision in every thread
      uint64_t running = through_mine - mine;
      if (running <= target && target < through_mine) {  // exactly one thread
        int64_t column = -1;
#pragma unroll
        for (int j = 0; j < kScanItems; ++j) {
          running += values[j];
          if (column < 0 && running > target) column = begin + j;
        }
        found = column;
      }
      __syncthreads();
      const int64_t result = found;
      __syncthreads();
      return result;
    }
    carry += total;
  }
  return -1;  // not reached: the slice's sum exceeds the target
}

// The first column of the row, in index order, at which the running sum of
// f(column, key) exceeds `target`; -1 when the row sums to at most target.
// Every block sums its slice; the block whose slice holds the target scans it.
template <typename T, typename F>
__device__ int64_t first_column_past(const RowView<T>& row, const RowGroup& g, uint64_t target, F f) {
  uint64_t local = 0;
  row.for_each([&](int64_t c, uint32_t key) { local += f(c, key); });
  uint64_t sums[kMaxRowBlocks];
  gather(g, block_reduce(local, false), sums);
  uint64_t before = 0;
  int owner = -1;
#pragma unroll
  for (int b = 0; b < kMaxRowBlocks; ++b) {
    if (b >= g.blocks || owner >= 0) continue;
    if (before + sums[b] > target) owner = b;
    else before += sums[b];
  }
  if (owner < 0) return -1;  // the same in every block
  int64_t columns[kMaxRowBlocks];
  gather(g, g.rank == owner ? scan_slice(row, target - before, f) : int64_t{-1}, columns);
  int64_t result = -1;
#pragma unroll
  for (int b = 0; b < kMaxRowBlocks; ++b)
    if (b == owner) result = columns[b];
  return result;
}

// A thread's histogram adds, gathered in registers for the last two bins it
// hit and added to the block's shared histogram when evicted (the older of
// the two) or flushed.
struct BinCache {
  uint32_t recent = kNoBin, older = kNoBin;
  uint64_t recent_sum = 0, older_sum = 0;

  __device__ __forceinline__ void add(uint64_t* histogram, uint32_t bin, uint64_t v) {
    if (v == 0) return;
    if (bin == recent) {
      recent_sum += v;
    } else if (bin == older) {
      older_sum += v;
    } else {
      if (older != kNoBin) atomicAdd(reinterpret_cast<unsigned long long*>(&histogram[older]), older_sum);
      older = recent, older_sum = recent_sum;
      recent = bin, recent_sum = v;
    }
  }

  __device__ __forceinline__ void flush(uint64_t* histogram) const {
    if (recent != kNoBin) atomicAdd(reinterpret_cast<unsigned long long*>(&histogram[recent]), recent_sum);
    if (older != kNoBin) atomicAdd(reinterpret_cast<unsigned long long*>(&histogram[older]), older_sum);
  }
};

__device__ void clear_bins(uint64_t* histogram, int bins) {
  for (int i = threadIdx.x; i < bins; i += kSampleThreads) histogram[i] = 0;
  __syncthreads();
}

// A block's histogram of one digit, and the group's summed into it.
struct Histograms {
  uint64_t* own;
  uint64_t* merged;
};

struct Threshold {
  uint32_t key;    // the digits chosen so far (the rest zero)
  uint64_t above;  // the sum over larger keys (below the target)
};

// The bin of one digit's histogram (summed over the group's blocks) at
// which the sum from the top bin down, starting from `from.above`, first
// reaches `target` (from.above < target <= from.above + the histogram's
// sum). Every block sums the group's histograms into its own `merged` (16
// bytes per load, a thread's loads all in flight together), then each
// thread sums a run of bins and a block scan finds the run that crosses;
// every block computes the same answer.
__device__ Threshold pick_bin(const RowGroup& g, const uint64_t* histogram, uint64_t* merged, int bins,
                              Threshold from, uint64_t target, int shift) {
  constexpr int kMaxPerThread = kMaxBins / kSampleThreads;
  static_assert(kMaxPerThread % 2 == 0 && (kMaxBins / 2) % (2 * kSampleThreads) == 0);
  __shared__ Threshold picked;
  const int per_thread = bins / kSampleThreads;  // 8 or 4
  const int first = static_cast<int>(threadIdx.x) * per_thread;
  g.sync();  // every block's histogram is complete
  uint64_t sums[kMaxPerThread] = {};
#pragma unroll
  for (int r = 0; r < kMaxRowBlocks; ++r) {
    if (r >= g.blocks) break;
    const uint64_t* remote = g.at(histogram, r) + first;
#pragma unroll
    for (int j = 0; j < kMaxPerThread; j += 2)
      if (j < per_thread) {
        const ulonglong2 pair = *reinterpret_cast<const ulonglong2*>(remote + j);
        sums[j] += pair.x;
        sums[j + 1] += pair.y;
      }
  }
#pragma unroll
  for (int j = 0; j < kMaxPerThread; ++j)
    if (j < per_thread) merged[first + j] = sums[j];
  g.sync();  // merged is complete, and every block has read the histograms before any clears its own
  const int top = bins - 1 - first;  // this thread's run, from the top: bins top .. top - per_thread + 1
  uint64_t mine = 0;
  for (int j = 0; j < per_thread; ++j) mine += merged[top - j];
  uint64_t total;
  const uint64_t through_mine = from.above + block_inclusive_scan(mine, &total);
  uint64_t running = through_mine - mine;
  if (running < target && target <= through_mine) {  // exactly one thread
    int d = top;
    while (running + merged[d] < target) running += merged[d--];
    picked = Threshold{from.key | (static_cast<uint32_t>(d) << shift), running};
  }
  __syncthreads();
  const Threshold t = picked;
  __syncthreads();  // picked and merged are free for the next call
  return t;
}

// Radix selection: the key at which the sum of v(column, key) over the row's
// columns in descending key order first reaches `target` (at most the
// total). Rounds before `first_round` were filled into `histogram` by the
// caller (only round 0 can be).
template <typename T, typename V>
__device__ Threshold select_threshold(const RowView<T>& row, const RowGroup& g, uint64_t target, V v,
                                      int first_round, Histograms& h) {
  Threshold t{0, 0};
  uint32_t mask = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int shift = digit_shift(round), bins = digit_bins(round);
    if (round >= first_round) {
      clear_bins(h.own, bins);
      BinCache cache;
      row.for_each([&](int64_t c, uint32_t key) {
        if ((key & mask) == t.key) cache.add(h.own, (key >> shift) & (bins - 1), v(c, key));
      });
      cache.flush(h.own);
    }
    t = pick_bin(g, h.own, h.merged, bins, t, target, shift);
    mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
  return t;
}

// Top-k as a cut: the k-th key and, among the columns with that key, the
// last kept one (all columns when top_k is 0 or at least n).
template <typename T>
__device__ Cut top_k_cut(const RowView<T>& row, const RowGroup& g, int64_t top_k, Histograms& h) {
  if (top_k <= 0 || top_k >= row.n) return Cut{0, row.n - 1};
  const Threshold t = select_threshold(
      row, g, static_cast<uint64_t>(top_k), [](int64_t, uint32_t) { return 1ull; }, 0, h);
  const uint64_t ties_kept = static_cast<uint64_t>(top_k) - t.above;
  const int64_t last =
      first_column_past(row, g, ties_kept - 1, [&](int64_t, uint32_t key) { return key == t.key ? 1ull : 0ull; });
  return Cut{t.key, last};
}

struct Nucleus {
  Cut cut;
  uint64_t mass;  // the kept weight
};

// Top-p within the top-k cut: the shortest prefix of the order whose weight
// reaches the nucleus mass, as a cut on the key and the last tied column.
// The pass that sums the top-k weight also fills the first digit's
// histogram when top-p can cut.
template <typename T, typename W>
__device__ Nucleus top_p_cut(const RowView<T>& row, const RowGroup& g, Cut top_k, float top_p, W weight,
                             Histograms& h) {
  auto kept_weight = [&](int64_t c, uint32_t key) { return top_k.keeps(c, key) ? weight(key) : 0ull; };
  const bool may_cut = top_p < 1.0f;
  if (may_cut) clear_bins(h.own, digit_bins(0));
  BinCache cache;
  uint64_t local = 0;
  row.for_each([&](int64_t c, uint32_t key) {
    const uint64_t w = kept_weight(c, key);
    local += w;
    if (may_cut) cache.add(h.own, key >> digit_shift(0), w);
  });
  if (may_cut) cache.flush(h.own);
  const uint64_t top_k_mass = row_reduce(g, local, false);
  const uint64_t wanted = sampling::nucleus_mass(top_k_mass, top_p);
  if (wanted >= top_k_mass) return Nucleus{top_k, top_k_mass};
  const Threshold t = select_threshold(row, g, wanted, kept_weight, 1, h);
  const uint64_t tie_weight = weight(t.key);  // > 0: the selection stopped on weight
  const uint64_t ties_kept = (wanted - t.above + tie_weight - 1) / tie_weight;
  const int64_t last = first_column_past(row, g, ties_kept - 1, [&](int64_t c, uint32_t key) {
    return key == t.key && top_k.keeps(c, key) ? 1ull : 0ull;
  });
  return Nucleus{Cut{t.key, last}, t.above + ties_kept * tie_weight};
}

// One row per group of row_blocks consecutive blocks (a cluster when more
// than one).
template <typename T>
__global__ void __launch_bounds__(kSampleThreads, 1) sample_kernel(SampleParams p, int row_blocks) {
  __shared__ alignas(16) uint64_t own[kMaxBins];
  __shared__ alignas(16) uint64_t merged[kMaxBins];
  Histograms histograms{own, merged};
  start_after_producers();
  const RowGroup g{row_blocks, static_cast<int>(blockIdx.x % row_blocks)};
  const int64_t r = blockIdx.x / row_blocks, n = p.valid_cols;
  const int64_t slice = ceil_div(ceil_div(n, row_blocks), kSliceAlign) * kSliceAlign;
  const int64_t lo = min(n, g.rank * slice);
  const RowView<T> row{static_cast<const T*>(p.logits), p.rows, p.cols, p.shards, r, n, lo, min(n, lo + slice)};
  const SampleRow s = p.settings[r];
  // The first column of the order: the largest key, then the lowest column.
  uint64_t best = 0;
  row.for_each([&](int64_t c, uint32_t key) {
    const uint64_t candidate = (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(c));
    best = candidate > best ? candidate : best;
  });
  best = row_reduce(g, best, true);
  int64_t id = static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(best));
  if (!sampling::has_token(static_cast<uint32_t>(best >> 32))) {
    id = -1;
  } else if (s.temperature != 0.0f) {
    const float max_logit = sampling::key_value(static_cast<uint32_t>(best >> 32));
    const double inv_temperature = sampling::inverse_temperature(s.temperature);
    auto weight = [&](uint32_t key) { return sampling::weight(sampling::key_value(key), max_logit, inv_temperature); };
    const Nucleus nucleus =
        top_p_cut(row, g, top_k_cut(row, g, s.top_k, histograms), s.top_p, weight, histograms);
    const uint64_t u = sampling::draw(s.random, nucleus.mass);
    id = first_column_past(
        row, g, u, [&](int64_t c, uint32_t key) { return nucleus.cut.keeps(c, key) ? weight(key) : 0ull; });
  }
  if (g.rank == 0 && threadIdx.x == 0) p.ids[r] = static_cast<int32_t>(id);
}

// Blocks per row: a cluster where the kernel was compiled for sm_90 or later.
template <typename T>
int row_blocks() {
  cudaFuncAttributes attributes{};
  LS_CHECK_CUDA(cudaFuncGetAttributes(&attributes, sample_kernel<T>));
  return attributes.ptxVersion >= 90 ? kMaxRowBlocks : 1;
}

}  // namespace

void sample(const SampleParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  dispatch_dtype(p.dtype, "sample", [&](auto t) {
    using T = decltype(t);
    const int blocks = row_blocks<T>();
    LS_LAUNCH_CLUSTERED("sample_kernel", sample_kernel<T>, dim3(static_cast<unsigned>(p.rows * blocks)),
                        dim3(kSampleThreads), static_cast<unsigned>(blocks), 0, stream, p, blocks);
  });
}

}  // namespace lockstep::cuda
