// How a model is split across the tensor-parallel ranks.
//
// Column-parallel (split by output rows of W): the fused QKV by heads (Qwen2's
// biases and nothing else follow them), the fused gate_up by intermediate
// columns. Row-parallel (split by input columns, followed by an all-reduce):
// o_proj and down_proj. Embedding and LM head are vocab-parallel, with the
// vocabulary padded to a multiple of the TP size. When TP exceeds the KV head
// count, each KV head is replicated on TP / num_kv_heads ranks.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config.h"

namespace lockstep {

struct ShardPlan {
  int rank = 0;
  int size = 1;
  int64_t q_heads_local = 0;
  int64_t q_head_begin = 0;
  int64_t kv_heads_local = 0;
  int64_t kv_head_begin = 0;
  int64_t inter_local = 0;
  int64_t inter_begin = 0;
  int64_t vocab_padded = 0;
  int64_t vocab_local = 0;   // rows of the padded table on this rank
  int64_t vocab_begin = 0;
  int64_t vocab_size = 0;    // the real vocabulary
  // Rows of this rank's table that are real vocabulary; the rest is padding.
  int64_t vocab_real_local() const {
    int64_t end = vocab_begin + vocab_local < vocab_size ? vocab_begin + vocab_local : vocab_size;
    return end > vocab_begin ? end - vocab_begin : 0;
  }

  // Refuses (kInvalidArgument, naming the numbers) a TP size that does not
  // divide the heads or the intermediate size, before anything is loaded.
  static ShardPlan make(const ModelConfig& config, int rank, int size);
  std::string summary() const;
};

}  // namespace lockstep
