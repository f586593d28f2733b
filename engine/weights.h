// This rank's weights, read from the memory-mapped checkpoint: sharded
// tensors are read slice by slice (each rank only its share of the bytes),
// replicated ones (norms, the o_proj bias) are read by rank 0 and broadcast,
// then checksummed on every rank. QKV and gate/up are fused at load.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/config.h"
#include "engine/io/safetensors.h"
#include "tp/communicator.h"
#include "tp/sharding.h"

namespace lockstep {

struct LayerWeights {
  Buffer input_norm;      // [hidden], replicated
  Buffer post_attn_norm;  // [hidden], replicated
  Buffer q_norm, k_norm;  // [head_dim], replicated (Qwen3)
  // qkv and gate_up hold W·diag(input_norm) and W·diag(post_attn_norm) where
  // the backend folds the norms (Backend::folds_input_norms).
  Buffer qkv;             // [(q_local + 2·kv_local)·head_dim, hidden]
  Buffer qkv_bias;        // [(q_local + 2·kv_local)·head_dim] (Qwen2)
  Buffer o_proj;          // [hidden, q_local·head_dim]
  Buffer o_bias;          // [hidden], replicated (attention_bias)
  Buffer gate_up;         // [2·inter_local, hidden]: gate rows then up rows
  Buffer down;            // [hidden, inter_local]
};

struct ModelWeights {
  Buffer embed;       // [vocab_local, hidden] in the products' weight dtype; padding rows are zero
  Buffer lm_head;     // [vocab_local, hidden]; empty when tied to embed
  Buffer final_norm;  // [hidden], replicated
  std::vector<LayerWeights> layers;
  const Buffer& lm_head_weight() const { return lm_head.empty() ? embed : lm_head; }
  int64_t bytes() const;  // all of this rank's weight buffers together
};

struct LoadStats {
  uint64_t sharded_bytes_in_checkpoint = 0;  // all ranks' shares together
  uint64_t sharded_bytes_read = 0;           // by this rank
  uint64_t replicated_bytes_read = 0;        // by this rank (rank 0 only)
  uint64_t replicated_checksum = 0;
};

// The bytes load_weights will allocate on this rank's backend, from the
// config alone: products and tables in `weight` dtype, norms and biases in
// `act` (checked before anything is read, against the memory there is).
int64_t weight_bytes(const ModelConfig& config, const ShardPlan& plan, DType weight, DType act);

// Checks every tensor's presence and shape against the config (naming the
// tensor) on every rank before any data is read.
void check_checkpoint_shapes(const TensorStore& store, const ModelConfig& config);
// Warns (once, from the engine) about checkpoint tensors the config leaves unread.
void warn_unread_tensors(const TensorStore& store, const ModelConfig& config);

// `comm` broadcasts the replicated weights in backend memory. The caller
// compares stats->replicated_checksum across ranks (verify_same_on_all_ranks,
// through a host transport) before the first step.
ModelWeights load_weights(const TensorStore& store, const ModelConfig& config, const ShardPlan& plan,
                          Communicator& comm, Backend& backend, LoadStats* stats);

}  // namespace lockstep
