// y = x · Wᵀ (+ bias), W stored [out_features, in_features] as in Hugging
// Face checkpoints. Tensor parallelism shards W by rows (column-parallel) or
// by columns (row-parallel); the op itself only sees the local shard.
#pragma once

#include <cstdint>

#include "kernels/op_common.h"

namespace lockstep {

struct LinearParams {
  const void* x = nullptr;       // [rows, in_features], row stride x_stride
  const void* weight = nullptr;  // [out_features, in_features]
  const void* bias = nullptr;    // [out_features] or null
  void* y = nullptr;             // [rows, out_features]
  int64_t rows = 0;
  int64_t in_features = 0;
  int64_t out_features = 0;
  int64_t x_stride = 0;  // elements between rows of x; 0 means in_features
  DType act_dtype = DType::kF32;     // of x, y, bias
  DType weight_dtype = DType::kF32;  // of weight
  int64_t x_row_stride() const { return x_stride == 0 ? in_features : x_stride; }
  void validate() const {
    LS_OP_REQUIRE(x && weight && y, "linear", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && in_features > 0 && out_features > 0, "linear",
                  "bad sizes rows={} in={} out={}", rows, in_features, out_features);
    LS_OP_REQUIRE(x_row_stride() >= in_features, "linear", "x_stride {} < in_features {}",
                  x_stride, in_features);
  }
};

namespace cpu {
void linear(const LinearParams& p);
}

}  // namespace lockstep
