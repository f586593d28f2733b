// Sampling (the rule of kernels/sampling.h) with one 512-thread block per
// row and no scratch beyond shared memory. Each pass reads the row again (it
// stays in L2), 16 bytes per load where the layout allows, several loads in
// flight per thread:
//   the first column of the order: a block max over (key, lowest column);
//   top-k: a radix selection of the k-th key (digits of 11, 11 and 10 bits
//     from the top, counts in a shared histogram), then an index-order scan
//     for the last kept column among those with that key;
//   the top-k weight sum, which also fills the first digit's histogram of
//     weights when top-p is on;
//   top-p: the other two digits of the same selection over weights, then
//     the index-order scan for the last kept tie;
//   the draw: an index-order scan (tiles of 8 consecutive columns per
//     thread, block prefix sums) for the column where the kept weight
//     passes u.
// Every sum is an integer sum, so the order of the additions cannot change
// the result, and the weights come from sampling_math.h as on the host.
// The lanes of a warp that add to the same histogram bin add once (match,
// then reduce): the leading digits of nearby logits mostly agree.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"
#include "kernels/sampling_math.h"

namespace lockstep::cuda {

namespace {

constexpr int kSampleThreads = 512;
constexpr int kWarps = kSampleThreads / 32;
constexpr int kScanItems = 8;       // consecutive columns per thread in the index-order scans
constexpr int kLoadsInFlight = 4;   // 16-byte loads per thread per step of a pass
constexpr int kRounds = 3;          // radix digits: bits 31-21, 20-10, 9-0 of the key
constexpr int kMaxBins = 1 << 11;
constexpr uint32_t kNoBin = 0xffffffffu;

__device__ __forceinline__ int digit_shift(int round) { return round == 0 ? 21 : round == 1 ? 10 : 0; }
__device__ __forceinline__ int digit_bins(int round) { return round == 2 ? 1 << 10 : 1 << 11; }

// One row of the logits, read through the shard layout of SampleParams.
template <typename T>
struct RowView {
  const T* logits;
  int64_t rows, cols, shards, row, n;  // n: the valid columns

  __device__ uint32_t key(int64_t col) const {
    // shards · cols < 2^31 (SampleParams::validate): 32-bit division.
    const int64_t shard = shards == 1 ? 0 : static_cast<uint32_t>(col) / static_cast<uint32_t>(cols);
    return sampling::order_key(to_float(logits[(shard * rows + row) * cols + (col - shard * cols)]));
  }

  // Calls f(column, key, valid) once for every column, spread over the
  // block, plus calls with valid = false: every warp's calls are convergent,
  // so f may use warp-synchronous intrinsics.
  template <typename F>
  __device__ void for_each(F f) const {
    constexpr int kVec = kVec16<T>;
    constexpr int64_t kStep = int64_t{kSampleThreads} * kLoadsInFlight;
    const int lane = threadIdx.x % 32, warp_first = threadIdx.x - lane;
    for (int64_t s = 0; s < shards && s * cols < n; ++s) {
      const int64_t first = s * cols, len = min(cols, n - first);
      const T* segment = logits + (s * rows + row) * cols;
      const int64_t vectors = reinterpret_cast<uintptr_t>(segment) % 16 == 0 ? len / kVec : 0;
      for (int64_t base = warp_first; base < vectors; base += kStep) {  // uniform per warp
        Vec<T, kVec> v[kLoadsInFlight];
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int64_t i = base + u * kSampleThreads + lane;
          if (i < vectors) v[u].load(segment + i * kVec);
        }
#pragma unroll
        for (int u = 0; u < kLoadsInFlight; ++u) {
          const int64_t i = base + u * kSampleThreads + lane;
          const bool valid = i < vectors;
#pragma unroll
          for (int j = 0; j < kVec; ++j) f(first + i * kVec + j, valid ? sampling::order_key(v[u].get(j)) : 0u, valid);
        }
      }
      for (int64_t base = vectors * kVec + warp_first; base < len; base += kSampleThreads) {
        const int64_t c = base + lane;
        const bool valid = c < len;
        f(first + c, valid ? sampling::order_key(to_float(segment[c])) : 0u, valid);
      }
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

// The first column, in index order, at which the running sum of f(column,
// key) exceeds `target`; -1 when the whole row sums to at most target. Each
// tile gives every thread kScanItems consecutive columns.
template <typename T, typename F>
__device__ int64_t first_column_past(const RowView<T>& row, uint64_t target, F f) {
  __shared__ int64_t found;
  uint64_t carry = 0;
  for (int64_t base = 0; base < row.n; base += static_cast<int64_t>(kSampleThreads) * kScanItems) {
    const int64_t begin = base + static_cast<int64_t>(threadIdx.x) * kScanItems;
    uint32_t keys[kScanItems];
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) keys[j] = begin + j < row.n ? row.key(begin + j) : 0u;
    uint64_t values[kScanItems], mine = 0;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) mine += values[j] = begin + j < row.n ? f(begin + j, keys[j]) : 0ull;
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
  return -1;
}

// Adds v (< 2^33) to bin `bin` of a shared histogram. Every lane of the warp
// calls it together (a lane with valid = false or v = 0 adds nothing); the
// lanes that share a bin sum their values (in 16-bit halves, so that the
// 32-bit warp reduction cannot overflow) and one of them adds.
__device__ __forceinline__ void add_to_bin(uint64_t* histogram, uint32_t bin, uint64_t v, bool valid) {
  const uint32_t label = valid && v != 0 ? bin : kNoBin;
  const unsigned peers = __match_any_sync(0xffffffffu, label);
  const unsigned low = __reduce_add_sync(peers, static_cast<unsigned>(v & 0xffffu));
  const unsigned high = __reduce_add_sync(peers, static_cast<unsigned>(v >> 16));
  if (label != kNoBin && static_cast<int>(threadIdx.x % 32) == __ffs(peers) - 1)
    atomicAdd(reinterpret_cast<unsigned long long*>(&histogram[bin]),
              (static_cast<unsigned long long>(high) << 16) + low);
}

__device__ void clear_bins(uint64_t* histogram, int bins) {
  for (int i = threadIdx.x; i < bins; i += kSampleThreads) histogram[i] = 0;
  __syncthreads();
}

struct Threshold {
  uint32_t key;    // the digits chosen so far (the rest zero)
  uint64_t above;  // the sum over larger keys (below the target)
};

// The bin of one digit's histogram at which the sum from the top bin down,
// starting from `from.above`, first reaches `target` (from.above < target
// <= from.above + the histogram's sum). Each thread sums a run of bins,
// then a block scan finds the run that crosses.
__device__ Threshold pick_bin(const uint64_t* histogram, int bins, Threshold from, uint64_t target, int shift) {
  __shared__ Threshold picked;
  const int per_thread = (bins + kSampleThreads - 1) / kSampleThreads;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * per_thread;  // this thread's highest bin
  uint64_t mine = 0;
  for (int j = 0; j < per_thread && top - j >= 0; ++j) mine += histogram[top - j];
  uint64_t total;
  const uint64_t through_mine = from.above + block_inclusive_scan(mine, &total);
  uint64_t running = through_mine - mine;
  if (running < target && target <= through_mine) {  // exactly one thread
    int d = top;
    while (running + histogram[d] < target) running += histogram[d--];
    picked = Threshold{from.key | (static_cast<uint32_t>(d) << shift), running};
  }
  __syncthreads();
  const Threshold t = picked;
  __syncthreads();
  return t;
}

// Radix selection: the key at which the sum of g(column, key) over the
// columns in descending key order first reaches `target` (at most the
// total). Rounds before `first_round` were filled into `histogram` by the
// caller (only round 0 can be).
template <typename T, typename G>
__device__ Threshold select_threshold(const RowView<T>& row, uint64_t target, G g, int first_round,
                                      uint64_t* histogram) {
  Threshold t{0, 0};
  uint32_t mask = 0;
  for (int round = 0; round < kRounds; ++round) {
    const int shift = digit_shift(round), bins = digit_bins(round);
    if (round >= first_round) {
      clear_bins(histogram, bins);
      row.for_each([&](int64_t c, uint32_t key, bool valid) {
        valid = valid && (key & mask) == t.key;
        add_to_bin(histogram, (key >> shift) & (bins - 1), valid ? g(c, key) : 0ull, valid);
      });
      __syncthreads();
    }
    t = pick_bin(histogram, bins, t, target, shift);
    mask |= static_cast<uint32_t>(bins - 1) << shift;
  }
  return t;
}

// Top-k as a cut: the k-th key and, among the columns with that key, the
// last kept one (all columns when top_k is 0 or at least n).
template <typename T>
__device__ Cut top_k_cut(const RowView<T>& row, int64_t top_k, uint64_t* histogram) {
  if (top_k <= 0 || top_k >= row.n) return Cut{0, row.n - 1};
  const Threshold t =
      select_threshold(row, static_cast<uint64_t>(top_k), [](int64_t, uint32_t) { return 1ull; }, 0, histogram);
  const uint64_t ties_kept = static_cast<uint64_t>(top_k) - t.above;
  const int64_t last =
      first_column_past(row, ties_kept - 1, [&](int64_t, uint32_t key) { return key == t.key ? 1ull : 0ull; });
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
__device__ Nucleus top_p_cut(const RowView<T>& row, Cut top_k, float top_p, W weight, uint64_t* histogram) {
  auto kept_weight = [&](int64_t c, uint32_t key) { return top_k.keeps(c, key) ? weight(key) : 0ull; };
  const bool may_cut = top_p < 1.0f;
  if (may_cut) clear_bins(histogram, digit_bins(0));
  uint64_t local = 0;
  row.for_each([&](int64_t c, uint32_t key, bool valid) {
    const uint64_t w = valid ? kept_weight(c, key) : 0ull;
    local += w;
    if (may_cut) add_to_bin(histogram, key >> digit_shift(0), w, valid);
  });
  const uint64_t top_k_mass = block_reduce(local, false);  // its barrier also completes the histogram
  const uint64_t wanted = sampling::nucleus_mass(top_k_mass, top_p);
  if (wanted >= top_k_mass) return Nucleus{top_k, top_k_mass};
  const Threshold t = select_threshold(row, wanted, kept_weight, 1, histogram);
  const uint64_t tie_weight = weight(t.key);  // > 0: the selection stopped on weight
  const uint64_t ties_kept = (wanted - t.above + tie_weight - 1) / tie_weight;
  const int64_t last = first_column_past(row, ties_kept - 1, [&](int64_t c, uint32_t key) {
    return key == t.key && top_k.keeps(c, key) ? 1ull : 0ull;
  });
  return Nucleus{Cut{t.key, last}, t.above + ties_kept * tie_weight};
}

template <typename T>
__global__ void __launch_bounds__(kSampleThreads, 1) sample_kernel(SampleParams p) {
  __shared__ uint64_t histogram[kMaxBins];
  start_after_producers();
  const RowView<T> row{static_cast<const T*>(p.logits), p.rows, p.cols, p.shards, blockIdx.x, p.valid_cols};
  const SampleRow s = p.settings[blockIdx.x];
  // The first column of the order: the largest key, then the lowest column.
  uint64_t best = 0;
  row.for_each([&](int64_t c, uint32_t key, bool valid) {
    const uint64_t candidate = (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(c));
    if (valid && candidate > best) best = candidate;
  });
  best = block_reduce(best, true);
  if (s.temperature == 0.0f) {
    if (threadIdx.x == 0) p.ids[blockIdx.x] = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(best));
    return;
  }
  const float max_logit = sampling::key_value(static_cast<uint32_t>(best >> 32));
  const double inv_temperature = sampling::inverse_temperature(s.temperature);
  auto weight = [&](uint32_t key) { return sampling::weight(sampling::key_value(key), max_logit, inv_temperature); };
  const Nucleus nucleus = top_p_cut(row, top_k_cut(row, s.top_k, histogram), s.top_p, weight, histogram);
  const uint64_t u = sampling::draw(s.random, nucleus.mass);
  const int64_t id = first_column_past(
      row, u, [&](int64_t c, uint32_t key) { return nucleus.cut.keeps(c, key) ? weight(key) : 0ull; });
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
