// The KV cache and attention over it.
//
// Cache layout, per layer, for K and for V, one of two (code finds an element
// through the strides below; the kernels take either):
// - position-major [num_slots, max_seq, num_kv_heads, head_dim], the CUDA
//   backend's: a token's kv heads side by side (on an H100 a head-major cache
//   left decode attention alone within 0.5% and the batch-32 step 1.1%
//   slower, twenty-sixth session);
// - head-major [num_slots, num_kv_heads, max_seq, head_dim], the CPU
//   backend's: each kv head's keys contiguous (the CPU's no-GQA prefill
//   attention ran 23% faster than on position-major, whose rows of one head
//   lie num_kv_heads·head_dim apart: benchmarks/RESULTS.md).
// A sequence owns one slot, so its cache is contiguous either way. Token t of
// a batch belongs to slot slots[t] at position positions[t].
//
// kv_append writes each token's k and v at its position. attention then lets
// token t attend to positions [0, positions[t]] of its slot, so a prompt of P
// tokens (causal prefill) and a decode batch of B sequences are the same call.
// With a sliding window W the range is [positions[t] - W + 1, positions[t]]
// (clipped at 0): W keys, the token's own among them (transformers' and
// flash-attention's definition). The cache still holds every position.
// GQA: q head h reads kv head h / (num_heads / num_kv_heads).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/op_common.h"

namespace lockstep {

// The first key a token at `position` attends to under a sliding window of
// `window` keys (0: no window): the CPU twin and the kernels share this rule.
LS_HOST_DEVICE inline int64_t window_first_key(int64_t window, int64_t position) {
  return window > 0 && position >= window ? position - window + 1 : 0;
}

struct KvCacheShape {
  int64_t num_slots = 0;
  int64_t max_seq = 0;
  int64_t num_kv_heads = 0;  // local
  int64_t head_dim = 0;
  bool head_major = false;  // the layout (above)
  int64_t slot_stride() const { return max_seq * num_kv_heads * head_dim; }
  int64_t position_stride() const { return head_major ? head_dim : num_kv_heads * head_dim; }
  int64_t head_stride() const { return head_major ? max_seq * head_dim : head_dim; }
  // Element offset of (slot, position, kv head).
  int64_t offset(int64_t slot, int64_t position, int64_t kv_head) const {
    return slot * slot_stride() + position * position_stride() + kv_head * head_stride();
  }
};

struct KvAppendParams {
  const void* qkv = nullptr;  // [tokens, (num_heads + 2·num_kv_heads)·head_dim]
  void* k_cache = nullptr;    // this layer's K
  void* v_cache = nullptr;    // this layer's V
  const int32_t* slots = nullptr;
  const int32_t* positions = nullptr;
  int64_t tokens = 0;
  int64_t num_heads = 0;  // local q heads (to find k and v in the qkv row)
  KvCacheShape cache;
  DType dtype = DType::kF32;
  void validate() const {
    LS_OP_REQUIRE(qkv && k_cache && v_cache && slots && positions, "kv_append", "null pointer");
    LS_OP_REQUIRE(tokens >= 0 && num_heads > 0 && cache.num_kv_heads > 0 && cache.head_dim > 0 &&
                      cache.max_seq > 0 && cache.num_slots > 0,
                  "kv_append", "bad sizes");
  }
};

struct AttentionParams {
  const void* qkv = nullptr;  // q read from the fused rows
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* positions = nullptr;
  void* out = nullptr;  // [tokens, num_heads·head_dim]
  int64_t tokens = 0;
  int64_t num_heads = 0;  // local q heads
  KvCacheShape cache;
  float scale = 0.0f;  // 1/sqrt(head_dim)
  DType dtype = DType::kF32;
  int64_t window = 0;  // sliding-window attention: keys a token sees, its own included (0: all before it)
  // Scratch for backends that split a sequence over several workers (the
  // CUDA backend fills it in; the CPU ignores it).
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // How many consecutive tokens of the batch share a slot, typically (1 for
  // decode, the chunk length for prefill). A tiling hint for backends: any
  // batch is computed correctly whatever it says.
  int64_t tokens_per_sequence_hint = 1;
  // True when no token of the batch shares its slot with a token at a lower
  // position (decode: one token per slot; padding rows all at position 0):
  // the step then writes no key below any token's own position, and a
  // backend may read those keys before the step's writes are done. False
  // is always correct.
  bool no_lower_writes = false;
  // At most this many workers per sequence (0: the backend's own rule).
  // Benchmarks set it to compare split counts; any value gives the same result.
  int64_t max_splits = 0;
  // At most this many tiles of query rows per launch (0: the backend's
  // limit). Tests set it to run a batch in several launches; any value gives
  // the same result.
  int64_t max_row_tiles_per_launch = 0;
  int64_t qkv_stride() const { return (num_heads + 2 * cache.num_kv_heads) * cache.head_dim; }
  void validate() const {
    LS_OP_REQUIRE(qkv && k_cache && v_cache && slots && positions && out, "attention", "null pointer");
    LS_OP_REQUIRE(tokens >= 0 && num_heads > 0 && cache.num_kv_heads > 0 &&
                      num_heads % cache.num_kv_heads == 0 && cache.head_dim > 0,
                  "attention", "bad head counts heads={} kv_heads={}", num_heads, cache.num_kv_heads);
    LS_OP_REQUIRE(scale > 0.0f, "attention", "scale must be positive");
    LS_OP_REQUIRE(max_splits >= 0, "attention", "max_splits {} must be >= 0", max_splits);
    LS_OP_REQUIRE(max_row_tiles_per_launch >= 0, "attention", "max_row_tiles_per_launch {} must be >= 0",
                  max_row_tiles_per_launch);
    LS_OP_REQUIRE(window >= 0, "attention", "window {} must be >= 0", window);
  }
  // The first position token t attends to, given its position.
  int64_t first_key(int64_t position) const { return window_first_key(window, position); }
};

namespace cpu {
void kv_append(const KvAppendParams& p);
void attention(const AttentionParams& p);
}  // namespace cpu

}  // namespace lockstep
