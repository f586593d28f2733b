// Temperature / top-k / top-p sampling where the logits are, one token per
// row, by a rule exact enough that the CPU twin and the GPU (and any TP
// degree) pick the same token from the same logits and random bits.
//
// The rule, per row, over its first valid_cols columns:
//  1. Order: the columns by logit, largest first, the lower column first
//     among equal logits (NaN ranks above +inf). Temperature 0: the first
//     column of the order (argmax, lowest column on ties); stop.
//  2. Weights: w = sampling::weight(logit, max logit, 1 / temperature),
//     integers of at most 2^32 (kernels/sampling_math.h), evaluated
//     identically on the host and the GPU; sums are 64-bit integers.
//  3. Top-k: the first top_k columns of the order (0: all).
//  4. Top-p: of those, the shortest prefix of the order whose weight sum
//     reaches sampling::nucleus_mass(sum of the top-k weights, top_p).
//  5. Draw: u = sampling::draw(random, weight sum of the nucleus); the token
//     is the first nucleus column, in column order (not logit order), at
//     which the running weight sum exceeds u.
// A row whose first column of the order is not finite (a logit is NaN or
// +inf, or none is above -inf: a model whose weights or config give
// non-finite values) has no token: its id is -1, greedy or sampled, as
// argmax and next_tokens give (kernels/argmax.h).
// The GPU finds the cut-offs of 3 and 4 by radix selection over the keys and
// needs no sort; the CPU twin is the sort-based reference.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

// One row's sampling settings (24 bytes; the runner uploads them with the
// batch, so nothing random happens on the device).
struct SampleRow {
  uint64_t random = 0;       // the draw's 64 random bits
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0: no limit
  void validate() const {
    LS_OP_REQUIRE(std::isfinite(temperature) && temperature >= 0.0f, "sample", "temperature {} is not finite and >= 0",
                  temperature);
    LS_OP_REQUIRE(top_p > 0.0f && top_p <= 1.0f, "sample", "top_p {} is outside (0, 1]", top_p);
    LS_OP_REQUIRE(top_k >= 0, "sample", "top_k {} is negative", top_k);
  }
};

struct SampleParams {
  // [shards][rows][cols]: column c of a row is column c % cols of block
  // c / cols (the all-gathered vocabulary shards; shards = 1: [rows, cols]).
  const void* logits = nullptr;
  const SampleRow* settings = nullptr;  // [rows]; checked by the caller on the host (SampleRow::validate)
  int32_t* ids = nullptr;               // [rows]: the chosen column
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t shards = 1;
  int64_t valid_cols = 0;  // columns from here on (of shards · cols) are vocabulary padding
  DType dtype = DType::kF32;
  void validate() const {
    LS_OP_REQUIRE(logits && settings && ids, "sample", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && cols > 0 && shards > 0 && valid_cols > 0 && valid_cols <= shards * cols &&
                      shards * cols < (int64_t{1} << 31),
                  "sample", "bad sizes rows={} cols={} shards={} valid_cols={}", rows, cols, shards, valid_cols);
  }
};

namespace cpu {
// Also checks every row's settings.
void sample(const SampleParams& p);
}

}  // namespace lockstep
