// Host side of flash-decoding (attention_split.cuh): how many splits each
// kernel's grid takes, the workspace they write, and the kernel arguments.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention_split.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace attention_detail {

namespace {

constexpr int kMinKeysPerSplit = 64;  // a split shorter than a key tile (kTcKeys) half-fills it
constexpr int kPrefillFillPerSm = 2;   // prefill tiles are split until the grid has this many blocks per SM
constexpr int kSplitBasePerSm = 4;     // splits only while the grid without them has fewer blocks per SM
constexpr int kSplitBlocksPerSm = 16;  // and the grid with them at most this many

// The workspace: the split counters, one per block of a split-free grid
// (fewer than kSplitBasePerSm·SMs whenever there are splits), then the
// splits' partial outputs [tokens, heads, splits, head_dim], then their
// (max, sum) pairs.
int64_t counter_bytes(int num_sms) { return ceil_div(int64_t{kSplitBasePerSm} * num_sms * 4, 256) * 256; }

}  // namespace

int shared_memory_per_sm() {
  int device = 0, bytes = 0;
  LS_CHECK_CUDA(cudaGetDevice(&device));
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  return bytes;
}

// Prefill tiles (of uneven causal lengths): split until the grid fills
// kPrefillFillPerSm blocks per SM.
int prefill_splits(int64_t base_blocks, int64_t max_seq, int num_sms) {
  const int64_t fill_blocks = int64_t{kPrefillFillPerSm} * num_sms;
  if (base_blocks >= fill_blocks) return 1;
  const int64_t fill = ceil_div(fill_blocks, base_blocks);
  const int64_t by_length = std::max<int64_t>(1, max_seq / kMinKeysPerSplit);
  return static_cast<int>(std::min<int64_t>({kMaxSplits, fill, by_length}));
}

// The CUDA-core kernel: splits per block of the split-free
// grid (`base_blocks` blocks) on a GPU that holds `slots` blocks at once.
// The time goes as the waves of blocks over the slots times the keys of one
// block (1/splits), so the rule takes the fewest splits that minimize
// waves/splits: a last wave that half fills the GPU costs as much as a full
// one. No splits once the grid without them fills every slot (measured:
// batch 64 of llama3-8b, 512 blocks on 396 slots, ran 5% faster unsplit than
// in 3 splits). At most one split per kMinKeysPerSplit keys of the longest
// sequence the cache holds (the lengths themselves live on the device).
int splits_by_waves(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms) {
  if (base_blocks >= std::min(slots, int64_t{kSplitBasePerSm} * num_sms)) return 1;
  const int64_t most = std::min<int64_t>({kMaxSplits, std::max<int64_t>(1, max_seq / kMinKeysPerSplit),
                                          std::max<int64_t>(1, int64_t{kSplitBlocksPerSm} * num_sms / base_blocks)});
  const auto cost = [&](int64_t splits) {
    return std::ceil(static_cast<double>(base_blocks * splits) / static_cast<double>(slots)) /
           static_cast<double>(splits);
  };
  int64_t best = 1;
  for (int64_t splits = 2; splits <= most; ++splits)
    if (cost(splits) < cost(best) * 0.99) best = splits;
  return static_cast<int>(best);
}

// The CUDA-core kernel's splits: the waves rule, except where its grid
// runs a few blocks over one an SM and capping the splits at SMs / base
// keeps one block an SM (padded in the launch) for at most 1/8 more keys a
// block. Those few blocks share an SM with another, which then takes twice
// as long as the rest. Example: bench's 1088 keys take 17 splits; eight KV
// heads at batch 1 make 136 blocks on 132 SMs, capped to 16 (128 blocks).
// Measured (forty-sixth session, H100, float32): that batch of a 1B llama
// shape +4.5% a step, the same grid of a 0.5B qwen2 shape (batch 4) level.
// Applying the tensor-core rule (splits <= SMs / base) to every grid of at
// most half the SMs lost 2-22% at batch 2-32 (the likeliest reading: its
// blocks need company on an SM to stream at the SM's share of bandwidth).
int splits_cuda_core(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms) {
  const int by_waves = splits_by_waves(base_blocks, max_seq, slots, num_sms);
  const int64_t capped = num_sms / base_blocks;
  if (base_blocks * by_waves > num_sms && capped * 9 >= int64_t{by_waves} * 8)
    return static_cast<int>(capped);
  return by_waves;
}

// Tensor-core decode tiles: as many splits as keep the grid at one block an
// SM at most, none once the grid without them fills half the SMs. One
// decode block keeps three key tiles in flight, enough to stream its SM's
// share of the bandwidth, so a second block on an SM brings its fixed costs
// (queries, partial writes, the merge) and no bandwidth. Measured
// (attention_bench, H100, launches one after another, ctx 1024 and 4096,
// head_dim 64-256, batch 1-32): this choice was within 3% of the fastest cap
// on the splits at batch 2-32, where filling every slot, as the CUDA-core
// kernel's rule does, was up to 17% slower (head_dim 64, batch 8: 6 splits in
// 384 blocks 15.2 us against 2 splits 13.0; head_dim 128, batch 16: 3 splits
// 29.6 us against none 27.9). At batch 1 the splits that the length does not
// reach cost 1-9% (sized for max_seq, they must be). The launch keeps such a
// grid at one block an SM (launch_tensor_core_kernel).
int splits_one_block_per_sm(int64_t base_blocks, int64_t max_seq, int num_sms) {
  if (base_blocks * 2 > num_sms) return 1;
  return static_cast<int>(std::min<int64_t>(
      {kMaxSplits, std::max<int64_t>(1, max_seq / kMinKeysPerSplit), num_sms / base_blocks}));
}

AttnArgs make_attn_args(const AttentionParams& p, int head_dim, int group, int head_chunks, int splits,
                        int num_sms) {
  auto* bytes = static_cast<unsigned char*>(p.workspace);
  float* ws = bytes != nullptr ? reinterpret_cast<float*>(bytes + counter_bytes(num_sms)) : nullptr;
  const int64_t entries = p.tokens * p.num_heads * splits;
  return AttnArgs{.qkv = p.qkv,
                  .k_cache = p.k_cache,
                  .v_cache = p.v_cache,
                  .slots = p.slots,
                  .positions = p.positions,
                  .out = p.out,
                  .counters = reinterpret_cast<int*>(bytes),
                  .ws_acc = ws,
                  .ws_ml = splits > 1 ? ws + entries * head_dim : nullptr,
                  .tokens = p.tokens,
                  .num_heads = p.num_heads,
                  .num_kv_heads = p.cache.num_kv_heads,
                  .slot_stride = p.cache.slot_stride(),
                  .pos_stride = p.cache.position_stride(),
                  .head_stride = p.cache.head_stride(),
                  .group = group,
                  .head_chunks = head_chunks,
                  .splits = splits,
                  .scale = p.scale,
                  .window = p.window,
                  .no_lower_writes = p.no_lower_writes,
                  .row_tile0 = 0};
}

// Splits whose partial results fit the workspace (at most `wanted`, and at
// most p.max_splits when set).
int splits_that_fit(const AttentionParams& p, int head_dim, int wanted, int64_t base_blocks, int num_sms) {
  if (p.max_splits > 0) wanted = static_cast<int>(std::min<int64_t>(wanted, p.max_splits));
  const int64_t bytes_per_split = p.tokens * p.num_heads * (head_dim + 2) * 4;
  const int64_t room = p.workspace_bytes - counter_bytes(num_sms);
  const int splits =
      static_cast<int>(std::min<int64_t>(wanted, std::max<int64_t>(1, room / std::max<int64_t>(1, bytes_per_split))));
  if (splits > 1)
    LS_OP_REQUIRE(p.workspace != nullptr && base_blocks < int64_t{kSplitBasePerSm} * num_sms, "attention",
                  "no workspace for {} splits of {} blocks", splits, base_blocks);
  return splits;
}

}  // namespace attention_detail

using namespace attention_detail;

int attention_splits_by_waves(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms) {
  return splits_by_waves(base_blocks, max_seq, slots, num_sms);
}

int attention_splits_cuda_core(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms) {
  return splits_cuda_core(base_blocks, max_seq, slots, num_sms);
}

int attention_splits_one_block_per_sm(int64_t base_blocks, int64_t max_seq, int num_sms) {
  return splits_one_block_per_sm(base_blocks, max_seq, num_sms);
}

int attention_decode_tile_smem_bytes(int64_t blocks, int num_sms, int smem_per_sm, int natural_bytes) {
  // One more block than the even share must not fit: with the 1 KB the
  // hardware reserves a block, (share + 1)·(bytes + 1 KB) > smem_per_sm.
  const int64_t share = ceil_div(blocks, int64_t{num_sms});
  const int64_t padded = smem_per_sm / (share + 1) + 16;
  return static_cast<int>(std::max<int64_t>(natural_bytes, padded));
}

int attention_cuda_core_padding_bytes(int64_t blocks, int num_sms, int smem_per_sm, int own_bytes) {
  if (blocks > num_sms) return 0;
  return attention_decode_tile_smem_bytes(1, num_sms, smem_per_sm, own_bytes) - own_bytes;
}

int64_t attention_workspace_bytes(int num_sms) {
  // Splits are used only while the blocks without splits are fewer than
  // kSplitBasePerSm·SMs, and then (blocks without splits)·splits is at most
  // kSplitBlocksPerSm·SMs; a block holds at most 8 heads (CUDA cores) or 16
  // query rows (tensor-core decode) of one token. Larger tiles (prefill) use
  // as many splits as this holds.
  return counter_bytes(num_sms) +
         int64_t{kSplitBlocksPerSm} * num_sms * std::max(kMaxGroup, 16) * (kMostHeadDim + 2) * 4;
}

void clear_attention_workspace(void* workspace, int num_sms, cudaStream_t stream) {
  LS_CHECK_CUDA(cudaMemsetAsync(workspace, 0, static_cast<size_t>(counter_bytes(num_sms)), stream));
}

}  // namespace lockstep::cuda
