// Embedding gather, vocab-parallel: this rank holds rows
// [row_begin, row_begin + rows_local) of the table; tokens outside that range
// produce zero rows, so a sum all-reduce over ranks gives the full embedding.
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct EmbeddingParams {
  const int32_t* ids = nullptr;  // [tokens]
  const void* table = nullptr;   // [rows_local, hidden]
  void* out = nullptr;           // [tokens, hidden]
  int64_t tokens = 0;
  int64_t hidden = 0;
  int64_t row_begin = 0;
  int64_t rows_local = 0;
  DType dtype = DType::kF32;        // of out
  DType table_dtype = DType::kF32;  // of table: dtype, or on the CPU a 16-bit table widened (exactly)
  void validate() const {
    LS_OP_REQUIRE(ids && table && out, "embedding", "null pointer");
    LS_OP_REQUIRE(tokens >= 0 && hidden > 0 && rows_local > 0 && row_begin >= 0, "embedding",
                  "bad sizes tokens={} hidden={} rows_local={}", tokens, hidden, rows_local);
  }
};

namespace cpu {
void embedding(const EmbeddingParams& p);
}

}  // namespace lockstep
