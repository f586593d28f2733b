#include "tp/sharding.h"

#include <fmt/format.h>

#include "common/error.h"

namespace lockstep {

ShardPlan ShardPlan::make(const ModelConfig& c, int rank, int size) {
  LS_REQUIRE(size >= 1 && rank >= 0 && rank < size, ErrorKind::kInternal, "bad rank {} of {}", rank, size);
  LS_REQUIRE(c.num_heads % size == 0, ErrorKind::kInvalidArgument,
             "tensor-parallel size {} does not divide num_attention_heads {}", size, c.num_heads);
  LS_REQUIRE(c.num_kv_heads % size == 0 || size % c.num_kv_heads == 0, ErrorKind::kInvalidArgument,
             "tensor-parallel size {} must divide num_key_value_heads {} or be a multiple of it", size,
             c.num_kv_heads);
  LS_REQUIRE(c.intermediate_size % size == 0, ErrorKind::kInvalidArgument,
             "tensor-parallel size {} does not divide intermediate_size {}", size, c.intermediate_size);
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  p.q_heads_local = c.num_heads / size;
  p.q_head_begin = rank * p.q_heads_local;
  if (c.num_kv_heads >= size) {
    p.kv_heads_local = c.num_kv_heads / size;
    p.kv_head_begin = rank * p.kv_heads_local;
  } else {  // replicate: ranks [k·r, k·(r+1)) share kv head r, k = size / num_kv_heads
    p.kv_heads_local = 1;
    p.kv_head_begin = rank / (size / c.num_kv_heads);
  }
  p.inter_local = c.intermediate_size / size;
  p.inter_begin = rank * p.inter_local;
  p.vocab_padded = (c.vocab_size + size - 1) / size * size;
  p.vocab_local = p.vocab_padded / size;
  p.vocab_begin = rank * p.vocab_local;
  p.vocab_size = c.vocab_size;
  return p;
}

std::string ShardPlan::summary() const {
  return fmt::format("rank {}/{}: q heads [{}, +{}), kv heads [{}, +{}), intermediate [{}, +{}), vocab [{}, +{}) of {}",
                     rank, size, q_head_begin, q_heads_local, kv_head_begin, kv_heads_local, inter_begin,
                     inter_local, vocab_begin, vocab_local, vocab_padded);
}

}  // namespace lockstep
