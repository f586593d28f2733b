// Attention over the KV cache, for prefill and decode alike (kernels/attention.h):
// token t's query heads attend to positions [0, positions[t]] of its slot, or
// to the last `window` of them.
//
// Two kernels, both flash-style (online softmax, no score matrix in memory):
// a tensor-core kernel for bf16/f16 with head_dim 16 and up (here, see its
// section below) and a CUDA-core kernel for the rest
// (attention_cuda_core.cu). When the batch alone does not fill the GPU, each
// sequence is split over several blocks (flash-decoding): every split block
// writes its partial result to the workspace, and the block that finishes
// last among the splits of its rows merges them (no second kernel;
// attention_split.cuh; the split rules are in attention_split.cu). The split
// count depends on the batch size only, never on the sequence lengths, which
// the kernels read from device memory: a captured graph stays valid as
// sequences grow. The kernel spreads the actual length over the splits
// (decode: at least kDecodeMinTilesPerSplit key tiles each; the blocks of
// splits past the length leave at once, and the merge takes the splits the
// length reaches).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/attention_tc_tile.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

using namespace attention_detail;

constexpr int64_t kMaxGridY = 65535;
// A decode split takes at least this many key tiles of the actual length,
// leaving the rest of the graph's splits (sized for max_seq) empty: a
// block's fixed costs (queries, positions, the merges) outweigh a tile's
// copy (attention_bench, H200, batch 1 at ctx 1024: 6 splits of 3 tiles 9.21
// us a launch, 18 of 1 tile 9.86). Empty splits must cost nothing: 6 splits
// of 3 tiles beside 12 empty ones that still wrote and merged took 11.94.
constexpr int kDecodeMinTilesPerSplit = 3;

// ---- Tensor-core path (bf16/f16, head_dim 16-256) ----
//
// One block of 4 warps per (tile of query rows, kv head, split). The query
// rows of kv head h are the flattened pairs (token t, q head g of h's group),
// row t·group + g. Prefill tiles (RowWarps = 4) are 64 consecutive rows,
// consecutive tokens' whole GQA groups; decode tiles (RowWarps = 1) are up
// to 16 q heads of one token, so that a decode block reads one sequence's
// keys. Tokens of one slot that are consecutive in the batch form a run; the
// block walks its runs one by one (a prefill chunk is one run), and for each
// run streams the slot's keys in tiles of 64 through shared memory
// (cp.async, zero-filled past the end; decode keeps the next tiles' copies
// in flight while it computes on the current one, tc_stages): S = Q·Kᵀ and O += P·V on
// mma.m16n8k16 with float32 accumulators, online softmax in registers.
// RowWarps = 4: each warp owns 16 rows and all 64 keys of a tile.
// RowWarps = 1: the warps share 16 rows and take 16 keys of each tile each,
// and merge their partial softmax states through shared memory at the end of
// a run. The tiles and the S = Q·Kᵀ step: attention_tc_tile.cuh.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Tiles of keys in a block's shared memory. Decode, where copies dominate,
// takes three, so that two tiles' copies are in flight while the block
// computes on the third: at head size 128 that is 104 KB a block, 2 blocks
// and ~4 tiles of copies in flight an SM, against 3 blocks and ~3 tiles with
// two stages. H200, llama3-8b's heads at ctx 1024, batch 32, us a launch
// (benchmarks/RESULTS.md): 128 39.6 -> 34.8, 96 34.1 -> 28.0, 64 20.9 ->
// 20.7; head size 80 keeps two (27.5 against 31.6 with three: measured, the
// cause not yet found). Prefill tiles compute more than they copy: one.
template <int HD>
constexpr int tc_stages(int row_warps) {
  return row_warps == 1 ? (HD == 80 ? 2 : 3) : 1;
}

// Shared memory of the decode tiling's merge of its warps (tc_merge_warps):
// each warp's 16 rows of outputs (padded rows), then 3 floats a (warp, row).
template <int HD>
constexpr int tc_merge_warps_bytes() {
  return (4 * 16 * (HD + 8) + 3 * 4 * 16) * static_cast<int>(sizeof(float));
}

// A block's query rows: flattened rows base .. base + count - 1 of kv head
// kv_head (row t·group + g is token t's q head g of it). A decode tile's
// rows are q heads head0 .. head0 + count - 1 of one token.
struct TileRows {
  int64_t base;
  int count;
  int64_t kv_head;
  int64_t token;  // decode tiles only
  int64_t head0;  // decode tiles only
};

// Prefill blocks take kv head blockIdx.x and row tile gridDim.y - 1 -
// blockIdx.y: the GPU starts blocks x fastest, so the last row tiles of
// every kv head start first. Under a causal mask the last rows attend to the
// most keys, so the longest blocks start first and the short ones fill the
// tail of the grid (tiles in x, in order, started the last kv head's longest
// blocks last: a tail of a few busy SMs). Decode blocks take their token's
// tile from x and the kv head from y.
template <int RowWarps>
__device__ TileRows tile_rows(const AttnArgs& a) {
  if constexpr (RowWarps == 4) {
    const int64_t base = (a.row_tile0 + gridDim.y - 1 - blockIdx.y) * 64;
    return {base, static_cast<int>(min(int64_t{64}, a.tokens * a.group - base)), blockIdx.x, 0, 0};
  } else {
    const int64_t token = blockIdx.x / a.head_chunks;
    const int chunk = static_cast<int>(blockIdx.x % a.head_chunks);
    return {token * a.group + chunk * 16, min(16, a.group - chunk * 16), blockIdx.y, token,
            static_cast<int64_t>(blockIdx.y) * a.group + chunk * 16};
  }
}

// Row r of the block's tile: its token and q head. Flattened rows fit an int
// (the launcher checks), so the division is 32-bit.
template <int RowWarps>
__device__ void tile_row(const AttnArgs& a, const TileRows& tr, int r, int64_t& token, int64_t& head) {
  if constexpr (RowWarps == 1) {
    token = tr.token, head = tr.head0 + r;
  } else {
    const int flat = static_cast<int>(tr.base) + r;
    token = flat / a.group, head = tr.kv_head * a.group + flat % a.group;
  }
}

// The query rows a thread's fragments cover: rows lane/4 and lane/4 + 8 of its warp's 16.
struct TcRows {
  int64_t token[2];
  int64_t head[2];  // q head index within the layer (local)
  bool valid[2];
};

template <typename T, int HD>
__device__ void load_query_fragments(const AttnArgs& a, const TcRows& rows, uint32_t (&qf)[(HD + 15) / 16][4]) {
  const int c = threadIdx.x % 4;
  const int64_t stride = (a.num_heads + 2 * a.num_kv_heads) * HD;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const T* q = static_cast<const T*>(a.qkv) + rows.token[i] * stride + rows.head[i] * HD;
#pragma unroll
    for (int ks = 0; ks < (HD + 15) / 16; ++ks)
#pragma unroll
      for (int h = 0; h < 2; ++h)  // past head_dim (the half step's upper 8): zeros
        qf[ks][2 * h + i] = rows.valid[i] && 16 * ks + 8 * h < HD
                                ? *reinterpret_cast<const uint32_t*>(q + 16 * ks + 8 * h + 2 * c)
                                : 0u;
  }
}

// Copies a prefill block's 64 query rows into shared memory (rows past
// tr.count zero-filled) and waits for them.
template <typename T, int HD>
__device__ void load_query_tile(const AttnArgs& a, const TileRows& tr, T* sq) {
  constexpr int kChunks = HD / 8, kLd = tc_row_pitch<HD>();
  const int64_t stride = (a.num_heads + 2 * a.num_kv_heads) * HD;
  for (int chunk = static_cast<int>(threadIdx.x); chunk < 64 * kChunks; chunk += kTcThreads) {
    const int r = chunk / kChunks, col = chunk % kChunks * 8;
    int64_t token = 0, head = 0;
    if (r < tr.count) tile_row<4>(a, tr, r, token, head);
    cp_async_16(sq + r * kLd + col, static_cast<const T*>(a.qkv) + token * stride + head * HD + col, r < tr.count);
  }
  cp_async_commit();
  cp_async_wait_group<0>();
  __syncthreads();
}

// Fills a warp's query fragments: registers from the rows, or shared memory
// from the block's tile (`sq`).
template <typename T, int HD, typename Query>
__device__ void load_query(const AttnArgs& a, const TcRows& rows, const TileRows& tr, T* sq, Query& q) {
  if constexpr (Query::kInSmem) {
    load_query_tile<T, HD>(a, tr, sq);
    q.warp_rows = sq + 16 * (threadIdx.x / 32) * Query::kLd;
  } else {
    load_query_fragments<T, HD>(a, rows, q.f);
  }
}

// A block's shared memory: its key tiles (and TcQuerySmem's rows after
// them), which hold the merges' scratch once every copy has landed (small
// heads need more for that than their tiles).
template <typename T, int HD, int RowWarps>
constexpr int tc_smem_bytes() {
  const int query = TcQuery<T, HD, RowWarps>::kInSmem ? 64 * tc_row_pitch<HD>() * static_cast<int>(sizeof(T)) : 0;
  const int tiles = tc_stages<HD>(RowWarps) * static_cast<int>(sizeof(TcTile<T, HD>)) + query;
  const int merges = std::max(merge_scratch_bytes(16 * RowWarps), RowWarps == 1 ? tc_merge_warps_bytes<HD>() : 0);
  return std::max(tiles, merges);
}

// Online-softmax state of one warp for its 16 rows (per thread: two rows).
template <int HD>
struct TcState {
  float m[2];  // running max, log2 units
  float l[2];  // this thread's part of the running sum
  float o[HD / 8][4];
  __device__ void reset() {
#pragma unroll
    for (int i = 0; i < 2; ++i) m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[d][e] = 0.0f;
  }
};

// Scales a warp's scores of keys [k0, k0 + Keys) of a tile at `tile_pos`
// to log2 units, -inf where row i may not see the key (tc_attend_tile), and
// sets mx[i] to row i's largest (this thread's share of it).
// A warp whose keys all lie inside both rows' ranges (every prefill tile below
// the diagonal) skips the mask: prefill attention -2 to -5% at head_dim 128,
// -8% at 80 and -10% at 64 on an H200 (benchmarks/RESULTS.md). Not at 96: the
// branch takes its prefill kernel from 168 to 176 registers, 3 to 2 blocks an
// SM, and +10%.
template <int HD, int Keys>
__device__ void scale_and_mask_scores(float (&sc)[Keys / 8][4], int k0, int64_t tile_pos, const int64_t (&limit)[2],
                                      int64_t window, float scale_log2, float (&mx)[2]) {
  constexpr bool kSkipMaskInside = HD != 96;
  const int c = threadIdx.x % 4;
  // Row i sees the tile's keys first[i] .. last[i] (tile-relative; none when first > last).
  int first[2], last[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    last[i] = static_cast<int>(max(int64_t{-1}, min(int64_t{kTcKeys}, limit[i] - tile_pos)));
    first[i] = static_cast<int>(max(int64_t{0}, min(int64_t{kTcKeys}, window_first_key(window, limit[i]) - tile_pos)));
  }
  mx[0] = mx[1] = -INFINITY;
  if (kSkipMaskInside && first[0] <= k0 && first[1] <= k0 && last[0] >= k0 + Keys - 1 && last[1] >= k0 + Keys - 1) {
#pragma unroll
    for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[j][e] *= scale_log2;
        mx[e / 2] = fmaxf(mx[e / 2], sc[j][e]);
      }
    return;
  }
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int key = k0 + 8 * j + 2 * c + e % 2;
      sc[j][e] = key >= first[i] && key <= last[i] ? sc[j][e] * scale_log2 : -INFINITY;
      mx[i] = fmaxf(mx[i], sc[j][e]);
    }
}

// One warp's share of a key tile: keys [k0, k0 + Keys) of the tile in shared
// memory, which start at absolute position `tile_pos`. Row i may see keys up
// to limit[i] (-1: none), and with a window only the last `window` of them.
template <typename T, int HD, int Keys, typename Query>
__device__ void tc_attend_tile(const TcTile<T, HD>& s, int k0, int64_t tile_pos, const int64_t (&limit)[2],
                               int64_t window, float scale_log2, const Query& q, TcState<HD>& st) {
  const int lane = threadIdx.x % 32;
  float sc[Keys / 8][4];
  if constexpr (Query::kInSmem)
    tc_scores_by_k_step<T, HD, Keys>(s, k0, q, sc);
  else
    tc_scores_by_key_group<T, HD, Keys>(s, k0, q, sc);
  float mx[2];
  scale_and_mask_scores<HD, Keys>(sc, k0, tile_pos, limit, window, scale_log2, mx);
  float alpha[2], base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float m_new = fmaxf(st.m[i], mx[i]);
    // No key seen yet (m_new = -inf): nothing to rescale, and every p is 0.
    alpha[i] = m_new == -INFINITY ? 1.0f : exp2f(st.m[i] - m_new);
    base[i] = m_new == -INFINITY ? 0.0f : m_new;
    st.m[i] = m_new;
    st.l[i] *= alpha[i];
  }
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[j][e] = exp2f(sc[j][e] - base[e / 2]);
      st.l[e / 2] += sc[j][e];
    }
  if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))  // a new running max: rescale
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) st.o[d][e] *= alpha[e / 2];
#pragma unroll
  for (int kk = 0; kk < Keys / 16; ++kk) {
    const uint32_t pa[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]), pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                            pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                            pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
    const int m = lane / 8;
#pragma unroll
    for (int dn = 0; dn + 1 < HD / 8; dn += 2) {
      uint32_t b[4];
      ldmatrix_x4<true>(b, &s.v[k0 + 16 * kk + (m % 2) * 8 + lane % 8][8 * dn + (m / 2) * 8]);
      mma_16816<T>(st.o[dn], pa, b[0], b[1]);
      mma_16816<T>(st.o[dn + 1], pa, b[2], b[3]);
    }
    if constexpr (kHalfStep<HD>) {  // the last 8 output dimensions alone (lanes 16-31 not read)
      constexpr int dn = HD / 8 - 1;
      uint32_t b[2];
      ldmatrix_x2<true>(b, &s.v[k0 + 16 * kk + (m % 2) * 8 + lane % 8][8 * dn]);
      mma_16816<T>(st.o[dn], pa, b[0], b[1]);
    }
  }
}

// Writes output dimensions d .. d + N - 1 of row h (token · heads + head):
// normalized when `whole` (the row's only split), else the split's partial
// state for the merge (m in natural-log units, as it expects).
template <typename T, int HD, int N>
__device__ void tc_store(const AttnArgs& a, int64_t h, int d, const float (&sum)[N], float m_log2, float l,
                         bool whole) {
  if (whole) {
    Vec<T, N> out;
#pragma unroll
    for (int e = 0; e < N; ++e) out.set(e, l > 0.0f ? sum[e] / l : 0.0f);
    out.store(static_cast<T*>(a.out) + h * HD + d);
    return;
  }
  const int64_t entry = h * a.splits + blockIdx.z;
  Vec<float, N> partial;
#pragma unroll
  for (int e = 0; e < N; ++e) partial.v[e] = sum[e];
  partial.store(a.ws_acc + entry * HD + d);
  if (d == 0) {
    a.ws_ml[entry * 2] = l > 0.0f ? m_log2 * kLn2 : -INFINITY;
    a.ws_ml[entry * 2 + 1] = l;
  }
}

// RowWarps = 4: each warp writes its own rows.
template <typename T, int HD>
__device__ void tc_finish_rows(const AttnArgs& a, const TcRows& rows, const bool (&active)[2], TcState<HD>& st) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
    if (!active[i]) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
      const float pair[2] = {st.o[d][2 * i], st.o[d][2 * i + 1]};
      tc_store<T, HD>(a, rows.token[i] * a.num_heads + rows.head[i], 8 * d + 2 * c, pair, st.m[i], st.l[i],
                      a.splits == 1);
    }
  }
}

// RowWarps = 1: the four warps hold the same rows (q heads head0 .. head0 +
// count - 1 of one token) over different keys. They merge through shared
// memory (the tile buffers, free by then): each warp's outputs, then one
// weight per (warp, row), then one thread per four output dimensions of a
// row sums the warps' outputs and writes them.
template <typename T, int HD>
__device__ void tc_merge_warps(const AttnArgs& a, const TileRows& tr, int used, TcState<HD>& st, void* smem) {
  constexpr int kLd = HD + 8;  // padded rows: conflict-free 8-byte stores (tc_merge_warps_bytes)
  float* so = static_cast<float*>(smem);  // [warp][row][kLd]
  float* sm = so + 4 * 16 * kLd;          // [warp][row]: running max (log2 units), then row r's max at [r]
  float* sw = sm + 4 * 16;                // [warp][row]: running sum, then the warp's weight
  float* sl = sw + 4 * 16;                // [row]: the merged sum
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, c = lane % 4;
  __syncthreads();  // every warp is done with the tiles
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
    const int r = g + 8 * i;
    if (r >= tr.count) continue;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d)
      *reinterpret_cast<float2*>(&so[(warp * 16 + r) * kLd + 8 * d + 2 * c]) =
          make_float2(st.o[d][2 * i], st.o[d][2 * i + 1]);
    if (c == 0) sm[warp * 16 + r] = st.m[i], sw[warp * 16 + r] = st.l[i];
  }
  __syncthreads();
  if (threadIdx.x < tr.count) {
    const int r = threadIdx.x;
    float m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w)
      if (sw[w * 16 + r] > 0.0f) m = fmaxf(m, sm[w * 16 + r]);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float lw = sw[w * 16 + r];
      const float weight = lw > 0.0f ? exp2f(sm[w * 16 + r] - m) : 0.0f;
      l += lw * weight;
      sw[w * 16 + r] = weight;
    }
    sm[r] = m, sl[r] = l;
  }
  __syncthreads();
  constexpr int kQuads = HD / 4;
  for (int item = threadIdx.x; item < tr.count * kQuads; item += kTcThreads) {
    const int r = item / kQuads, d = item % kQuads * 4;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const float weight = sw[w * 16 + r];
      const float4 o = *reinterpret_cast<const float4*>(&so[(w * 16 + r) * kLd + d]);
      sum.x += weight * o.x, sum.y += weight * o.y, sum.z += weight * o.z, sum.w += weight * o.w;
    }
    const float quad[4] = {sum.x, sum.y, sum.z, sum.w};
    tc_store<T, HD>(a, tr.token * a.num_heads + tr.head0 + r, d, quad, sm[r], sl[r], used == 1);
  }
}

// Copies one tile of keys and values, [tile, tile + kTcKeys) clipped to end
// (zero-filled past it). When a key's 16-byte chunks divide the block
// (head_dim 16, 32, 64, 128, 256), thread i copies chunk i % (HD/8) of keys
// i / (HD/8) + n·kKeyStep: one 64-bit base address per tile, then 32-bit
// steps (a slot's keys span far less than 2^31 elements). Otherwise (80, 96,
// 112, 160, 192, and the odd chunk counts of sizes that are not multiples of
// 16) thread i copies chunks i + n·kTcThreads of the tile, each at its own
// key and column.
template <typename T, int HD>
__device__ void load_kv_tile(TcTile<T, HD>& s, const T* k_base, const T* v_base, int64_t pos_stride, int64_t tile,
                             int64_t end) {
  constexpr int kChunks = HD / 8;
  if constexpr (kTcThreads % kChunks == 0) {
    constexpr int kKeyStep = kTcThreads / kChunks;
    static_assert(kTcKeys % kKeyStep == 0, "a tile's keys split evenly over the threads");
    const int key0 = static_cast<int>(threadIdx.x) / kChunks, col = static_cast<int>(threadIdx.x) % kChunks * 8;
    const int valid = static_cast<int>(min(int64_t{kTcKeys}, end - tile)) - key0;
    // Out-of-range chunks name a key this thread copies in range, or key 0.
    const int64_t offset = valid > 0 ? (tile + key0) * pos_stride + col : col;
    const T* k = k_base + offset;
    const T* v = v_base + offset;
    const int step = kKeyStep * static_cast<int>(pos_stride);
#pragma unroll
    for (int n = 0; n < kTcKeys / kKeyStep; ++n) {
      const bool in_range = n * kKeyStep < valid;
      const int at = in_range ? n * step : 0;  // out of range: nothing is read (zero-filled)
      cp_async_16(&s.k[key0 + n * kKeyStep][col], k + at, in_range);
      cp_async_16(&s.v[key0 + n * kKeyStep][col], v + at, in_range);
    }
  } else {
    const int valid = static_cast<int>(min(int64_t{kTcKeys}, end - tile));
#pragma unroll
    for (int n = 0; n < (kTcKeys * kChunks + kTcThreads - 1) / kTcThreads; ++n) {
      const int chunk = static_cast<int>(threadIdx.x) + n * kTcThreads;
      if (kTcKeys * kChunks % kTcThreads != 0 && chunk >= kTcKeys * kChunks) break;  // an odd count of chunks
      const int key = chunk / kChunks, col = chunk % kChunks * 8;
      const bool in_range = key < valid;
      const int64_t offset = in_range ? (tile + key) * pos_stride + col : col;  // out of range: nothing is read
      cp_async_16(&s.k[key][col], k_base + offset, in_range);
      cp_async_16(&s.v[key][col], v_base + offset, in_range);
    }
  }
  cp_async_commit();
}

// A run of the block's tokens: consecutive tokens first .. last of one
// slot, from `first` up to last_token, the longest length among them and the
// first key any of them attends to (0 without a window).
struct KvRun {
  int64_t first, last, len, lo;
  int32_t slot;
};

__device__ inline KvRun find_run(const AttnArgs& a, int64_t first, int64_t last_token) {
  const int64_t position = a.positions[first];
  KvRun run{first, first, position + 1, first_key(a, position), a.slots[first]};
  while (run.last < last_token && a.slots[run.last + 1] == run.slot) {
    ++run.last;
    const int64_t p = a.positions[run.last];
    run.len = max(run.len, p + 1);
    run.lo = min(run.lo, first_key(a, p));
  }
  return run;
}

// Which of the thread's two rows belong to the run, and the last key each
// may see (-1: none).
__device__ inline void run_rows(const AttnArgs& a, const TcRows& rows, const KvRun& run, bool (&active)[2],
                                int64_t (&limit)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    active[i] = rows.valid[i] && rows.token[i] >= run.first && rows.token[i] <= run.last;
    limit[i] = active[i] ? a.positions[rows.token[i]] : -1;
  }
}

// The keys this block's split takes of a run's keys [run.lo, run.len),
// counted in key tiles from the tile holding run.lo: [begin, end), `tiles`
// key tiles, and the splits that take part (`used`: for decode, the splits
// the length reaches, each at least kDecodeMinTilesPerSplit tiles; for
// prefill all of them).
struct SplitKeys {
  int64_t begin, end, tiles;
  int used;
};

template <int RowWarps>
__device__ SplitKeys split_keys(const AttnArgs& a, const KvRun& run) {
  const int64_t start = run.lo / kTcKeys * kTcKeys;
  const int64_t len_tiles = ceil_div(run.len - start, kTcKeys);
  const int64_t tiles_per_split =
      max(RowWarps == 1 ? int64_t{kDecodeMinTilesPerSplit} : int64_t{1}, ceil_div(len_tiles, a.splits));
  SplitKeys k;
  k.used = RowWarps == 1 ? static_cast<int>(min(int64_t{a.splits}, ceil_div(len_tiles, tiles_per_split))) : a.splits;
  k.begin = start + blockIdx.z * tiles_per_split * kTcKeys;
  k.end = min(run.len, k.begin + tiles_per_split * kTcKeys);
  k.tiles = k.end > k.begin ? ceil_div(k.end - k.begin, kTcKeys) : 0;
  return k;
}

// Prefill blocks wait for the kernel before (which writes the step's keys)
// at once. A decode block (one token) first reads its slot and length (no
// kernel writes them) and, when the batch has no lower writes, starts the
// copies of the key tiles wholly below its own position's tile, which the
// step does not write, before it waits: those copies overlap the end of the
// kernel before.
template <typename T, int HD, int RowWarps>
__global__ void __launch_bounds__(kTcThreads) attention_tensor_core_kernel(AttnArgs a) {
  constexpr int kKeyWarps = 4 / RowWarps;
  constexpr int kWarpKeys = kTcKeys / kKeyWarps;
  constexpr int kStages = tc_stages<HD>(RowWarps);
  extern __shared__ __align__(16) unsigned char smem[];  // kStages tiles
  auto* buf = reinterpret_cast<TcTile<T, HD>*>(smem);
  if constexpr (RowWarps == 4) start_after_producers();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const TileRows tr = tile_rows<RowWarps>(a);
  const int64_t kvh = tr.kv_head;
  const int warp_row0 = 16 * (warp % RowWarps);
  const int k0 = kWarpKeys * (warp / RowWarps);

  TcRows rows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = warp_row0 + lane / 4 + 8 * i;
    rows.valid[i] = r < tr.count;
    tile_row<RowWarps>(a, tr, rows.valid[i] ? r : 0, rows.token[i], rows.head[i]);
  }
  using Query = TcQuery<T, HD, RowWarps>;
  Query query;
  T* const query_tile = reinterpret_cast<T*>(buf + kStages);  // TcQuerySmem only (tc_smem_bytes)
  if constexpr (RowWarps == 4) load_query<T, HD>(a, rows, tr, query_tile, query);
  const float scale_log2 = a.scale * kLog2e;
  const int64_t pos_stride = a.pos_stride;
  const int64_t last_token = (tr.base + tr.count - 1) / a.group;
  int used = a.splits;  // splits that take part (decode: those the length reaches)

  for (int64_t run_begin = tr.base / a.group; run_begin <= last_token;) {
    const KvRun run = find_run(a, run_begin, last_token);
    bool active[2];
    int64_t limit[2];
    run_rows(a, rows, run, active, limit);
    const SplitKeys keys = split_keys<RowWarps>(a, run);
    used = keys.used;
    // A decode block holds one token: splits past its length leave at once, writing nothing.
    if (RowWarps == 1 && static_cast<int>(blockIdx.z) >= used) return;
    const int64_t begin = keys.begin, end = keys.end, tiles = keys.tiles, len = run.len;
    const T* k_base = static_cast<const T*>(a.k_cache) + run.slot * a.slot_stride + kvh * a.head_stride;
    const T* v_base = static_cast<const T*>(a.v_cache) + run.slot * a.slot_stride + kvh * a.head_stride;
    // Tiles [0, issued) have their copies issued, tile i into buffer i % kStages.
    int64_t issued = 0;
    const auto issue_until = [&](int64_t n) {
      for (; issued < min(n, tiles); ++issued)
        load_kv_tile<T, HD>(buf[issued % kStages], k_base, v_base, pos_stride, begin + issued * kTcKeys, end);
    };
    if constexpr (RowWarps == 1) {
      if (a.no_lower_writes) issue_until(min(int64_t{kStages}, ((len - 1) / kTcKeys * kTcKeys - begin) / kTcKeys));
      start_after_producers();
      load_query<T, HD>(a, rows, tr, query_tile, query);
    }
    issue_until(kStages - 1);
    TcState<HD> st;
    st.reset();
    for (int64_t i = 0; i < tiles; ++i) {
      issue_until(i + kStages);
      cp_async_wait_for<kStages - 1>(issued - i - 1);  // tile i has landed; the tiles after it may be in flight
      __syncthreads();
      tc_attend_tile<T, HD, kWarpKeys>(buf[i % kStages], k0, begin + i * kTcKeys, limit, a.window, scale_log2,
                                       query, st);
      __syncthreads();  // buffer i % kStages is free for tile i + kStages
    }
    if constexpr (RowWarps == 1)
      tc_merge_warps<T, HD>(a, tr, used, st, smem);  // a decode tile is one token: one run
    else
      tc_finish_rows<T, HD>(a, rows, active, st);
    run_begin = run.last + 1;
  }
  if (used > 1 && arrive_last_split(a, used))  // the key tiles are free: every copy has landed
    merge_splits<T, HD>(
        a, used, tr.count,
        [&](int r) {
          int64_t token, head;
          tile_row<RowWarps>(a, tr, r, token, head);
          return token * a.num_heads + head;
        },
        reinterpret_cast<float*>(smem));
}

// Decode tiles are launched early (programmatic launch), while the kernel
// before them still runs, so their blocks are placed as SMs free up: an SM
// that frees first takes as many as fit while another idles, and a grid
// that an even spread runs in one round then takes two. Their shared memory
// is padded (attention_decode_tile_smem_bytes) so that no SM takes more than
// its even share. Without it, the one-block-an-SM grid of a
// Llama-3.2-1B-shaped step at batch 16 (128 blocks) ran 32% slower
// (forty-second session); with it, decode ran 2-8% faster than under the
// rule before (forty-fourth session, benchmarks/RESULTS.md).
template <typename T, int HD, int RowWarps>
void launch_tensor_core_kernel(dim3 grid, const AttnArgs& args, int num_sms, cudaStream_t stream) {
  const int per_sm = shared_memory_per_sm();
  const int natural = tc_smem_bytes<T, HD, RowWarps>();
  const int64_t blocks = int64_t{grid.x} * grid.y * grid.z;
  const int smem = RowWarps == 1 ? attention_decode_tile_smem_bytes(blocks, num_sms, per_sm, natural) : natural;
  // Over 48 KB of shared memory needs the opt-in, per device: set it each time (a host-side
  // attribute), for decode tiles to the largest padding (one block an SM) whichever this launch
  // takes, so that the limit never falls below what a graph captured earlier launches with.
  LS_CHECK_CUDA(cudaFuncSetAttribute(
      attention_tensor_core_kernel<T, HD, RowWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      RowWarps == 1 ? attention_decode_tile_smem_bytes(1, num_sms, per_sm, natural) : natural));
  LS_LAUNCH("attention_tensor_core_kernel", (attention_tensor_core_kernel<T, HD, RowWarps>), grid, dim3(kTcThreads),
            smem, stream, args);
}

template <typename T, int HD>
void launch_attention_tensor_core(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int group = static_cast<int>(p.num_heads / c.num_kv_heads);
  // Prefill-like batches (long runs of one slot) fill 64-row tiles; decode
  // batches use one token's q heads (16 at a time) with the warps splitting the keys.
  LS_OP_REQUIRE(p.tokens * group < (int64_t{1} << 31), "attention", "{} tokens of {} q heads per kv head exceed the "
                "tiling's 32-bit row index", p.tokens, group);
  const bool wide = p.tokens_per_sequence_hint * group >= 48;
  const int head_chunks = wide ? 1 : static_cast<int>(ceil_div(group, 16));
  const int64_t row_tiles = wide ? ceil_div(p.tokens * group, 64) : p.tokens * head_chunks;
  const int64_t base = row_tiles * c.num_kv_heads;
  const int wanted =
      wide ? prefill_splits(base, c.max_seq, num_sms) : splits_one_block_per_sm(base, c.max_seq, num_sms);
  const int splits = splits_that_fit(p, HD, wanted, base, num_sms);
  const AttnArgs args = make_attn_args(p, HD, group, head_chunks, splits, num_sms);
  if (wide) {
    // kv heads in x, row tiles in y (tile_rows), in launches of at most a
    // grid's y extent, the last tiles first.
    const int64_t per_launch = p.max_row_tiles_per_launch > 0 ? std::min(p.max_row_tiles_per_launch, kMaxGridY)
                                                               : kMaxGridY;
    for (int64_t end = row_tiles; end > 0; end -= per_launch) {
      AttnArgs part = args;
      part.row_tile0 = std::max<int64_t>(0, end - per_launch);
      launch_tensor_core_kernel<T, HD, 4>(dim3(static_cast<unsigned>(c.num_kv_heads),
                                               static_cast<unsigned>(end - part.row_tile0),
                                               static_cast<unsigned>(splits)),
                                          part, num_sms, stream);
    }
  } else {
    launch_tensor_core_kernel<T, HD, 1>(dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(c.num_kv_heads),
                                             static_cast<unsigned>(splits)),
                                        args, num_sms, stream);
  }
}

}  // namespace

void require_attention_head_dim(int64_t head_dim) { require_head_dim(head_dim, "attention"); }

void attention(const AttentionParams& p, int num_sms, cudaStream_t stream) {
  p.validate();
  if (p.tokens == 0) return;
  dispatch_dtype(p.dtype, "attention", [&](auto t) {
    using T = decltype(t);
    dispatch_head_dim(p.cache.head_dim, "attention", [&](auto hd) {
      constexpr int HD = decltype(hd)::value;
      if constexpr (kTensorCoreAttention<T, HD>)
        launch_attention_tensor_core<T, HD>(p, num_sms, stream);
      else
        attention_cuda_core(p, num_sms, stream);
    });
  });
}

}  // namespace lockstep::cuda
