// KV-cache append and attention against the CPU reference: decode batches
// (one token per sequence, random slots and lengths, so the sequence splits
// of flash-decoding are exercised), causal prefill chunks, and mixed batches
// (runs of several lengths, each its own sequence, under both tilings of the
// tensor-core kernel), for GQA ratios 1, 4, 5, 8 and 16 and head_dim 64, 128
// and 256, and other multiples of 8 (24-248); sliding windows.
#include <string>

#include "kernels/cuda/ops.h"
#include "tests/cuda/cuda_test_support.h"
#include "tests/test_support.h"

namespace lockstep {
namespace {

enum class Layout {
  kDecode,   // one token per slot, random positions
  kPrefill,  // consecutive positions of one slot
  kMixed,    // runs of 5, 1, 13, 2, 1, 7, ... tokens, each run its own slot at consecutive positions
};

struct AttnCase {
  int64_t tokens, heads, kv_heads, head_dim;
  Layout layout;
  int64_t hint = 0;  // tokens_per_sequence_hint; 0: the layout's true longest run
  int64_t max_splits = 0;
  int64_t window = 0;  // sliding window (0: none)
  int64_t row_tiles_per_launch = 0;  // max_row_tiles_per_launch (0: the backend's limit)
};

// no_lower_writes holds for every decode layout (one token per slot); it is
// set for all but head_dim 64, so that decode runs both with the key copies
// issued before the wait for the rope kernel (which writes each token's own
// key just before) and without.
bool early_keys(const AttnCase& c) { return c.layout == Layout::kDecode && c.head_dim != 64; }

std::string describe(const AttnCase& c) {
  const char* names[] = {"decode", "prefill", "mixed"};
  return std::string(names[static_cast<int>(c.layout)]) + " tokens=" + std::to_string(c.tokens) +
         " heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " hd=" + std::to_string(c.head_dim) +
         " hint=" + std::to_string(c.hint) + " max_splits=" + std::to_string(c.max_splits) +
         " window=" + std::to_string(c.window) + " row_tiles_per_launch=" + std::to_string(c.row_tiles_per_launch) +
         (early_keys(c) ? " no_lower_writes" : "");
}

// Slots and positions of each layout; returns the longest run of one slot.
int64_t fill_layout(const AttnCase& ac, int64_t max_seq, std::mt19937& rng, std::vector<int32_t>& slots,
                    std::vector<int32_t>& pos) {
  std::uniform_int_distribution<int32_t> pick_pos(0, static_cast<int32_t>(max_seq - 1));
  const int32_t start =
      std::uniform_int_distribution<int32_t>(0, static_cast<int32_t>(max_seq - ac.tokens))(rng);
  static const int run_lengths[] = {5, 1, 13, 2, 1, 7};
  int64_t longest = 1;
  for (int64_t t = 0, run = 0, in_run = 0, slot = 0; t < ac.tokens; ++t) {
    const auto i = static_cast<size_t>(t);
    if (ac.layout == Layout::kDecode) {
      slots[i] = static_cast<int32_t>(t), pos[i] = pick_pos(rng);
    } else if (ac.layout == Layout::kPrefill) {
      slots[i] = 1, pos[i] = start + static_cast<int32_t>(t), longest = ac.tokens;
    } else {
      if (in_run == run_lengths[run % 6]) ++run, ++slot, in_run = 0;
      slots[i] = static_cast<int32_t>(slot), pos[i] = start + static_cast<int32_t>(in_run++);
      longest = std::max(longest, in_run);
    }
  }
  return longest;
}

class CudaAttentionTest : public CudaOpTest {
 public:
  void run_case(const AttnCase& ac, DType dt, std::mt19937& rng) {
    const KvCacheShape cache{.num_slots = ac.layout == Layout::kPrefill ? 2 : ac.tokens,
                             .max_seq = 1200,
                             .num_kv_heads = ac.kv_heads,
                             .head_dim = ac.head_dim};
    const int64_t cache_elems = cache.num_slots * cache.slot_stride();
    // Earlier context: the whole cache starts filled with random keys/values.
    std::vector<float> k = random_cache_values(cache_elems, dt, rng), v = random_cache_values(cache_elems, dt, rng);
    const int64_t width = (ac.heads + 2 * ac.kv_heads) * ac.head_dim;
    std::vector<float> qkv = random_values(ac.tokens * width, dt, rng, 2.0f);
    std::vector<int32_t> slots(static_cast<size_t>(ac.tokens)), pos(static_cast<size_t>(ac.tokens));
    const int64_t longest = fill_layout(ac, cache.max_seq, rng, slots, pos);
    DeviceArray d_k(k, dt), d_v(v, dt), d_qkv(qkv, dt), d_slots(slots), d_pos(pos);
    DeviceArray d_out(ac.tokens * ac.heads * ac.head_dim, dt);
    DeviceArray d_ws(cuda::attention_workspace_bytes(num_sms_) / 4, DType::kF32);  // filled with 0xff
    cuda::clear_attention_workspace(d_ws.get(), num_sms_, stream_);
    KvAppendParams ap{.qkv = d_qkv.get(), .k_cache = d_k.get(), .v_cache = d_v.get(), .slots = d_slots.ints(),
                      .positions = d_pos.ints(), .tokens = ac.tokens, .num_heads = ac.heads, .cache = cache,
                      .dtype = dt};
    AttentionParams p{.qkv = d_qkv.get(), .k_cache = d_k.get(), .v_cache = d_v.get(), .slots = d_slots.ints(),
                      .positions = d_pos.ints(), .out = d_out.get(), .tokens = ac.tokens, .num_heads = ac.heads,
                      .cache = cache, .scale = 1.0f / std::sqrt(static_cast<float>(ac.head_dim)), .dtype = dt,
                      .window = ac.window, .workspace = d_ws.get(), .workspace_bytes = cuda::attention_workspace_bytes(num_sms_),
                      .tokens_per_sequence_hint = ac.hint > 0 ? ac.hint : longest,
                      .no_lower_writes = early_keys(ac),
                      .max_splits = ac.max_splits,
                      .max_row_tiles_per_launch = ac.row_tiles_per_launch};
    // The KV append runs fused into qk_norm_rope; a zero frequency makes the
    // rotation exact identity, so the cache must hold exact copies.
    const std::vector<float> zero_freq(static_cast<size_t>(ac.head_dim / 2), 0.0f);
    DeviceArray d_freq(zero_freq, DType::kF32);
    cuda::qk_norm_rope(QkNormRopeParams{.qkv = d_qkv.get(), .positions = d_pos.ints(),
                                        .inv_freq = static_cast<const float*>(d_freq.get()), .tokens = ac.tokens,
                                        .num_heads = ac.heads, .num_kv_heads = ac.kv_heads, .head_dim = ac.head_dim,
                                        .dtype = dt, .kv_append = ap},
                       stream_);
    cuda::attention(p, num_sms_, stream_);
    sync();
    // The split blocks count themselves in the workspace and the last one
    // merges: a second call on the same workspace must find the counts
    // cleared and give the same output, bit for bit.
    const std::vector<float> first = d_out.download();
    cuda::attention(p, num_sms_, stream_);
    sync();
    EXPECT_EQ(d_out.download(), first) << "second call on the same workspace, " << describe(ac);
    std::vector<float> want(static_cast<size_t>(ac.tokens * ac.heads * ac.head_dim));
    KvAppendParams cap = ap;
    cap.qkv = qkv.data(), cap.k_cache = k.data(), cap.v_cache = v.data(), cap.slots = slots.data();
    cap.positions = pos.data(), cap.dtype = DType::kF32;
    cpu::kv_append(cap);
    AttentionParams cp = p;
    cp.qkv = qkv.data(), cp.k_cache = k.data(), cp.v_cache = v.data(), cp.slots = slots.data();
    cp.positions = pos.data(), cp.out = want.data(), cp.dtype = DType::kF32;
    cpu::attention(cp);
    expect_close(d_k.download(), k, DType::kF32, "kv_append K " + describe(ac));  // exact copies
    expect_close(d_v.download(), v, DType::kF32, "kv_append V " + describe(ac));
    expect_close(d_out.download(), want, dt, "attention " + describe(ac));
  }

 protected:
  int num_sms() {
    int n = 0;
    LS_CHECK_CUDA(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
    return n;
  }
  void SetUp() override {
    CudaOpTest::SetUp();
    if (!IsSkipped()) num_sms_ = num_sms();
  }
  int num_sms_ = 0;
};

// Decode and mixed batches: one test per dtype, so that compute-sanitizer,
// which runs a test at a time per process, can check them side by side.
void decode_cases(CudaAttentionTest& t, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t tokens : odd_rows()) {
    if (tokens > 111) continue;  // one slot per token: the cache grows with the batch
    for (auto [heads, kv] : {std::pair{2, 2}, {8, 2}, {10, 2}, {16, 2}, {16, 1}})
      for (int64_t hd : {64, 128}) t.run_case({tokens, heads, kv, hd, Layout::kDecode}, dt, rng);
  }
  if (dt == DType::kBF16) t.run_case({3, 8, 1, 256, Layout::kDecode}, dt, rng);
  // Small heads (test models): 8 on CUDA cores with idle lanes, 16 and 32 on tensor cores in 16-bit.
  for (int64_t hd : {8, 16, 32}) t.run_case({7, 8, 2, hd, Layout::kDecode}, dt, rng);
  for (int64_t cap : {1, 2, 5})  // a cap on the splits below the rule's choice
    for (int64_t hd : {32, 128}) t.run_case({1, 32, 8, hd, Layout::kDecode, 0, cap}, dt, rng);
}

// Host code (runs without a GPU): the head sizes attention is built for, and
// a one-line refusal of the others, which the engine asks before loading.
TEST(AttentionHeadDims, OthersAreRefusedByName) {
  for (int64_t hd : {8, 24, 48, 64, 72, 80, 96, 112, 120, 128, 136, 160, 176, 192, 248, 256})
    EXPECT_NO_THROW(cuda::require_attention_head_dim(hd));
  for (int64_t hd : {-8, 0, 4, 12, 100, 260, 264, 512})
    expect_error([&] { cuda::require_attention_head_dim(hd); }, ErrorKind::kModel,
                 {"head_dim " + std::to_string(hd), "not supported by the CUDA backend"});
}

// The decode split rule (host code: runs without a GPU), on an H200's 132
// SMs with 3 decode blocks per SM (head_dim 128) and sequences of up to
// 1152 keys (at most 18 splits of 64), llama3-8b's 8 kv heads.
TEST(AttentionSplits, FewestSplitsForTheFewestWaves) {
  const auto splits = [](int64_t base) { return cuda::attention_splits_by_waves(base, 1152, 396, 132); };
  EXPECT_EQ(splits(8), 18);    // batch 1: as many as the keys allow
  EXPECT_EQ(splits(64), 6);    // batch 8: 384 blocks, one wave
  EXPECT_EQ(splits(256), 3);   // batch 32: 768 blocks in 2 waves, against 512 in 2 with 2 splits
  EXPECT_EQ(splits(395), 1);   // 790 blocks in 2 waves or 1185 in 3: no better than 395 in 1
  EXPECT_EQ(splits(396), 1);   // the grid without splits fills every slot: none
  EXPECT_EQ(splits(512), 1);   // batch 64
  EXPECT_EQ(cuda::attention_splits_by_waves(600, 1152, 1000, 132), 1);  // 4 blocks per SM: none
  EXPECT_EQ(cuda::attention_splits_by_waves(8, 100, 396, 132), 1);  // under two splits' worth of keys
}

// The CUDA-core kernel's rule as launched (132 SMs, 3 blocks an SM): the
// waves rule's grid is capped at one block an SM only where it runs a few
// blocks over that and the cap costs at most 1/8 more keys a block.
TEST(AttentionSplits, CudaCoreCapsAGridJustOverOneBlockAnSm) {
  const auto splits = [](int64_t base, int64_t max_seq) {
    return cuda::attention_splits_cuda_core(base, max_seq, 396, 132);
  };
  EXPECT_EQ(splits(8, 1088), 16);   // 17 splits would make 136 blocks: 128
  EXPECT_EQ(splits(8, 1152), 16);   // 18 would make 144: 16 is 1/8 more keys a block
  EXPECT_EQ(splits(9, 1152), 18);   // 14 would be 2/7 more keys: 162 blocks, as the waves rule
  EXPECT_EQ(splits(2, 1088), 17);   // 34 blocks: under one an SM already
  EXPECT_EQ(splits(7, 1088), 17);   // 119 blocks
  EXPECT_EQ(splits(16, 1088), 17);  // 272 blocks: 8 splits would double the keys a block
  EXPECT_EQ(splits(66, 1088), 6);   // 396 blocks: every slot once, three an SM
  EXPECT_EQ(splits(600, 1088), 1);  // no splits
}

// The tensor-core decode rule on 132 SMs: splits while the grid holds at most
// one block an SM; none from 67 blocks (half the SMs) up.
TEST(AttentionSplits, TensorCoreDecodeAtOneBlockAnSm) {
  const auto splits = [](int64_t base, int64_t max_seq) {
    return cuda::attention_splits_one_block_per_sm(base, max_seq, 132);
  };
  EXPECT_EQ(splits(8, 1152), 16);    // batch 1 of 8 kv heads: 128 blocks
  EXPECT_EQ(splits(16, 1152), 8);    // batch 2
  EXPECT_EQ(splits(64, 1152), 2);    // batch 8
  EXPECT_EQ(splits(66, 1152), 2);    // 132 blocks: every SM once
  EXPECT_EQ(splits(67, 1152), 1);    // two splits would put a second block on an SM
  EXPECT_EQ(splits(128, 1152), 1);   // batch 16
  EXPECT_EQ(splits(2, 1 << 20), 32);  // two kv heads (Qwen2.5-0.5B): at most kMaxSplits
  EXPECT_EQ(splits(2, 100), 1);      // under two splits' worth of keys
  EXPECT_EQ(splits(1, 200), 3);      // one split per 64 keys at most
}

// Decode tiles' shared memory on an H100 (132 SMs, 228 KB an SM, 1 KB
// reserved a block): padded so that an SM holds at most the grid's even
// share of blocks, the kernel's own size where that already holds.
TEST(AttentionSplits, DecodeTileSmemHoldsTheEvenShare) {
  constexpr int kSms = 132, kPerSm = 228 * 1024, kReserved = 1024, kNatural = 48 * 1024;
  const auto fitting = [](int bytes) { return kPerSm / (bytes + kReserved); };
  for (const int64_t blocks : {1, 66, 128, 132, 133, 200, 256, 264, 396}) {
    const int bytes = cuda::attention_decode_tile_smem_bytes(blocks, kSms, kPerSm, kNatural);
    const int64_t share = (blocks + kSms - 1) / kSms;
    EXPECT_EQ(fitting(bytes), share) << blocks << " blocks: " << bytes << " bytes";
  }
  // Four blocks of the kernel's own size fit; a grid of 4 or more blocks an SM is not padded.
  EXPECT_EQ(cuda::attention_decode_tile_smem_bytes(528, kSms, kPerSm, kNatural), kNatural);
  EXPECT_EQ(cuda::attention_decode_tile_smem_bytes(2000, kSms, kPerSm, kNatural), kNatural);
  EXPECT_EQ(cuda::attention_decode_tile_smem_bytes(1, kSms, kPerSm, 150 * 1024), 150 * 1024);
}

// The CUDA-core kernel is padded to one block an SM only where its grid
// spreads that thin (attention_cuda_core.cu says what was measured).
TEST(AttentionSplits, CudaCorePaddingOnlyUnderOneBlockAnSm) {
  constexpr int kSms = 132, kPerSm = 228 * 1024, kReserved = 1024, kOwn = 9 * 1024;
  for (const int64_t blocks : {1, 32, 131, 132}) {
    const int padding = cuda::attention_cuda_core_padding_bytes(blocks, kSms, kPerSm, kOwn);
    EXPECT_EQ(kPerSm / (kOwn + padding + kReserved), 1) << blocks << " blocks: " << padding << " bytes of padding";
  }
  for (const int64_t blocks : {133, 264, 1024})
    EXPECT_EQ(cuda::attention_cuda_core_padding_bytes(blocks, kSms, kPerSm, kOwn), 0) << blocks << " blocks";
  EXPECT_EQ(cuda::attention_cuda_core_padding_bytes(1, kSms, kPerSm, 150 * 1024), 0);
}

TEST_F(CudaAttentionTest, DecodeMatchesCpuF32) { decode_cases(*this, DType::kF32, 11); }
TEST_F(CudaAttentionTest, DecodeMatchesCpuBf16) { decode_cases(*this, DType::kBF16, 111); }
TEST_F(CudaAttentionTest, DecodeMatchesCpuF16) { decode_cases(*this, DType::kF16, 211); }

// Head sizes other than 64 and 128, decode with splits, a prefill chunk
// longer than a key tile and mixed runs, in every dtype. In 16-bit they take
// the tensor-core kernel: all but 256 with a key's chunks that do not divide
// the block's threads, 48, 80, 112 and 176 with an odd count of 16-wide k
// steps, 24, 72, 120, 136 and 248 ending in half a k step (and an odd count
// of 8-wide output tiles), 136-256 with the prefill queries in shared memory.
// In float32 every size takes the CUDA-core kernel (lanes past head_dim /
// kLaneDims idle). One small test, so that the sanitizers can run it whole.
TEST_F(CudaAttentionTest, OtherHeadSizesMatchCpu) {
  std::mt19937 rng(31);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t hd : {24, 48, 72, 80, 96, 112, 120, 136, 160, 176, 192, 248, 256}) {
      run_case({19, 10, 2, hd, Layout::kDecode}, dt, rng);
      run_case({1, 8, 8, hd, Layout::kDecode}, dt, rng);
      run_case({133, 8, 2, hd, Layout::kPrefill}, dt, rng);
      for (int64_t hint : {0, 1}) run_case({29, 8, 2, hd, Layout::kMixed, hint}, dt, rng);
    }
}

// Sliding windows of 1 key up to longer than any sequence, under both
// kernels (tensor cores: 16-bit at 64, 80, 120 (half a k step) and 128; CUDA
// cores: float32): decode with splits whose keys start mid-tile (and a cap of
// 2 splits), a prefill chunk whose 64-row tiles hold rows of different first
// keys, and mixed runs under both tilings. One small test, so that the
// sanitizers can run it whole.
TEST_F(CudaAttentionTest, WindowsMatchCpu) {
  std::mt19937 rng(41);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t hd : {64, 80, 120, 128}) {
      if (hd == 80 && dt != DType::kBF16) continue;
      for (int64_t window : {1, 37, 200, 5000}) {
        run_case({19, 8, 2, hd, Layout::kDecode, 0, 0, window}, dt, rng);
        run_case({3, 16, 2, hd, Layout::kDecode, 0, 2, window}, dt, rng);
      }
      for (int64_t window : {1, 5, 64, 100}) run_case({133, 8, 2, hd, Layout::kPrefill, 0, 0, window}, dt, rng);
      for (int64_t hint : {0, 1}) run_case({29, 8, 2, hd, Layout::kMixed, hint, 0, 3}, dt, rng);
    }
}

// One test per dtype, so that the sanitizers' runs of them (one process a
// test, side by side) each take a third of the work.
void prefill_cases(CudaAttentionTest& t, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t tokens : odd_rows())
    for (auto [heads, kv] : {std::pair{2, 2}, {8, 2}, {10, 2}, {16, 2}}) {
      const bool big = tokens > 111;
      if (big && heads != 8) continue;  // keep the CPU reference's time in check
      for (int64_t hd : {64, 128}) t.run_case({tokens, heads, kv, hd, Layout::kPrefill}, dt, rng);
    }
  if (dt == DType::kF16) t.run_case({19, 16, 2, 256, Layout::kPrefill}, dt, rng);
  for (int64_t hd : {8, 16, 32}) t.run_case({19, 4, 2, hd, Layout::kPrefill}, dt, rng);
}

// A prefill batch in several launches (the tensor-core kernel's grid holds
// at most 65535 tiles of 64 query rows a launch; these cases cap it lower):
// 989 tokens of 4 q heads per kv head are 62 tiles, in launches of 5 and of
// 61 (the last launch, which holds the first tiles, short), and of 7 with a
// window; 111 tokens are 7 tiles split over the keys, in launches of 2; and
// runs of several slots, 11 tiles in launches of 3. Head size 256 keeps its
// queries in shared memory.
TEST_F(CudaAttentionTest, PrefillInSeveralLaunchesMatchesCpu) {
  std::mt19937 rng(14);
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t hd : {64, 128, 256}) {
      for (int64_t per_launch : {5, 61}) run_case({989, 8, 2, hd, Layout::kPrefill, 0, 0, 0, per_launch}, dt, rng);
      run_case({989, 8, 2, hd, Layout::kPrefill, 0, 0, 100, 7}, dt, rng);
      run_case({111, 8, 2, hd, Layout::kPrefill, 0, 0, 0, 2}, dt, rng);
      run_case({133, 10, 2, hd, Layout::kMixed, 0, 0, 0, 3}, dt, rng);
    }
}

TEST_F(CudaAttentionTest, PrefillMatchesCpuF32) { prefill_cases(*this, DType::kF32, 12); }
TEST_F(CudaAttentionTest, PrefillMatchesCpuBf16) { prefill_cases(*this, DType::kBF16, 112); }
TEST_F(CudaAttentionTest, PrefillMatchesCpuF16) { prefill_cases(*this, DType::kF16, 212); }

// Several sequences' runs in one batch, under the hint of the longest run
// (64-row tiles that span runs) and under hint 1 (16-row tiles).
void mixed_run_cases(CudaAttentionTest& t, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int64_t tokens : {7, 19, 111})
    for (auto [heads, kv] : {std::pair{2, 2}, {8, 2}, {10, 2}, {16, 1}})
      for (int64_t hd : {64, 128})
        for (int64_t hint : {0, 1}) t.run_case({tokens, heads, kv, hd, Layout::kMixed, hint}, dt, rng);
}

TEST_F(CudaAttentionTest, MixedRunsMatchCpuF32) { mixed_run_cases(*this, DType::kF32, 13); }
TEST_F(CudaAttentionTest, MixedRunsMatchCpuBf16) { mixed_run_cases(*this, DType::kBF16, 113); }
TEST_F(CudaAttentionTest, MixedRunsMatchCpuF16) { mixed_run_cases(*this, DType::kF16, 213); }

}  // namespace
}  // namespace lockstep
