// Per-head q/k RMSNorm (Qwen3; skipped when the weights are null) followed by
// rotary position embedding, in place on the q and k parts of the fused QKV
// rows [q (num_heads·head_dim) | k (num_kv_heads·head_dim) | v]. The rotation
// pairs element i with i + head_dim/2 (the Hugging Face "rotate_half" layout).
// With kv_append set, the rotated k and the v of each token then go to the KV
// cache as that op describes (one kernel on the GPU, two ops on the CPU).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/attention.h"
#include "kernels/op_common.h"

namespace lockstep {

struct QkNormRopeParams {
  void* qkv = nullptr;                 // [tokens, (num_heads + 2·num_kv_heads)·head_dim]
  const int32_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [head_dim / 2], scaling already applied
  const void* q_norm_weight = nullptr; // [head_dim] or null
  const void* k_norm_weight = nullptr; // [head_dim] or null
  int64_t tokens = 0;
  int64_t num_heads = 0;     // local q heads
  int64_t num_kv_heads = 0;  // local kv heads
  int64_t head_dim = 0;
  float eps = 0.0f;          // q/k norm epsilon (rms_norm_eps)
  float cos_sin_scale = 1.0f;  // multiplies cos and sin (YaRN's attention factor; 1 otherwise)
  DType dtype = DType::kF32;
  std::optional<KvAppendParams> kv_append;  // reads the same qkv rows after the rotation
  int64_t row_stride() const { return (num_heads + 2 * num_kv_heads) * head_dim; }
  void validate() const {
    LS_OP_REQUIRE(qkv && positions && inv_freq, "qk_norm_rope", "null pointer");
    LS_OP_REQUIRE((q_norm_weight == nullptr) == (k_norm_weight == nullptr), "qk_norm_rope",
                  "q and k norm weights must both be set or both be null");
    LS_OP_REQUIRE(tokens >= 0 && num_heads > 0 && num_kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
                  "qk_norm_rope", "bad sizes heads={} kv_heads={} head_dim={}", num_heads,
                  num_kv_heads, head_dim);
    LS_OP_REQUIRE(q_norm_weight == nullptr || eps > 0.0f, "qk_norm_rope", "eps must be positive");
    LS_OP_REQUIRE(cos_sin_scale > 0.0f, "qk_norm_rope", "cos_sin_scale must be positive");
    if (kv_append) {
      const KvAppendParams& a = *kv_append;
      a.validate();
      LS_OP_REQUIRE(a.qkv == qkv && a.positions == positions && a.tokens == tokens && a.num_heads == num_heads &&
                        a.cache.num_kv_heads == num_kv_heads && a.cache.head_dim == head_dim && a.dtype == dtype,
                    "qk_norm_rope", "the KV append must read the same qkv rows");
    }
  }
};

namespace cpu {
void qk_norm_rope(const QkNormRopeParams& p);
}

}  // namespace lockstep
