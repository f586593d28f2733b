// y = x · Wᵀ (+ bias), W stored [out_features, in_features] as in Hugging
// Face checkpoints. Tensor parallelism shards W by rows (column-parallel) or
// by columns (row-parallel); the op itself only sees the local shard.
//
// Optional stages make one op of what a decoder layer does around its
// projections, so that a backend can fuse them (the CUDA matrix-vector path
// runs the product and its output stage as one kernel) or run them one after
// another (every other path, the CPU reference included) with the same
// result:
//   input_norm: x is the output of an RMSNorm (fused residual add included),
//     computed first from its own params (input_norm->out must be x);
//   silu_mul: the product's [rows, 2·inter] output (y, laid out [gate | up])
//     goes through SiLU·mul into silu_mul->out;
//   qk_norm_rope: the product's output is the fused QKV rows, which go
//     through the q/k norm, RoPE and the KV append in place.
//   input_rms: x holds an RMSNorm's input rows and the norm's weight is
//     folded into W (W[o, i] · g[i], at load): each output row r is
//     y[r, :] = (x[r, :]·Wᵀ) / sqrt(mean(x[r, :]²) + eps) + bias, which is
//     the product of the normed rows without a norm kernel. The output stage
//     (silu_mul or qk_norm_rope, one is required) reads the scaled rows; a
//     backend may scale inside that stage, or norm the rows into
//     InputRms::normed first where that is cheaper.
//   residual: y = x·Wᵀ + bias + residual (the residual add that follows
//     o_proj and down, folded into the product).
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/op_common.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace lockstep {

struct InputRms {
  float eps = 0.0f;  // the folded norm's epsilon, from the model's config
  // [rows, in_features] of act_dtype, or null: scratch into which a backend
  // may write the normed rows and run the plain product on them (the CUDA
  // backend does for many rows, where the product is compute-bound and one
  // norm pass costs less than the output stage's per-block row scale).
  void* normed = nullptr;
};

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
  // Runs before the product; its `out` is x. Its residual_out must not alias
  // its residual or x: a fused kernel reads the old residual in every block.
  std::optional<RmsNormParams> input_norm;
  // Runs after the product on y ([gate | up] rows); a fused kernel writes
  // only silu_mul->out and leaves y unwritten.
  std::optional<SiluMulParams> silu_mul;
  // Runs after the product on y (the QKV rows); a fused kernel writes y and
  // the KV cache as the op would.
  std::optional<QkNormRopeParams> qk_norm_rope;
  // Rows of x scaled by their inverse RMS after the product (see above).
  std::optional<InputRms> input_rms;
  // [rows, out_features], added to y; must not alias x or y.
  const void* residual = nullptr;
  int64_t x_row_stride() const { return x_stride == 0 ? in_features : x_stride; }
  void validate() const {
    LS_OP_REQUIRE(x && weight && y, "linear", "null pointer");
    LS_OP_REQUIRE(rows >= 0 && in_features > 0 && out_features > 0, "linear",
                  "bad sizes rows={} in={} out={}", rows, in_features, out_features);
    LS_OP_REQUIRE(x_row_stride() >= in_features, "linear", "x_stride {} < in_features {}",
                  x_stride, in_features);
    if (input_norm) {
      const RmsNormParams& n = *input_norm;
      n.validate();
      LS_OP_REQUIRE(n.out == x && n.rows == rows && n.cols == in_features && x_row_stride() == in_features &&
                        n.dtype == act_dtype,
                    "linear", "the input norm must write x ([rows, in_features], {})", dtype_name(act_dtype));
      LS_OP_REQUIRE(!n.residual_out || (n.residual_out != n.residual && n.residual_out != n.x), "linear",
                    "the input norm's residual_out aliases its input");
    }
    if (input_rms) {
      LS_OP_REQUIRE(input_rms->eps > 0.0f && !input_norm && x_row_stride() == in_features &&
                        (silu_mul || qk_norm_rope),
                    "linear", "input_rms needs eps > 0, contiguous x, no input norm and an output stage");
      LS_OP_REQUIRE(input_rms->normed != x && input_rms->normed != y, "linear",
                    "input_rms's normed scratch must not alias x or y");
    }
    if (residual != nullptr) {
      LS_OP_REQUIRE(residual != y && residual != x && !silu_mul && !qk_norm_rope, "linear",
                    "the residual must not alias x or y, and y must be the product's output");
    }
    if (silu_mul) {
      const SiluMulParams& s = *silu_mul;
      s.validate();
      LS_OP_REQUIRE(s.gate_up == y && s.rows == rows && 2 * s.inter == out_features && s.dtype == act_dtype,
                    "linear", "the SiLU·mul stage must read y ([rows, 2·{}])", s.inter);
    }
    if (qk_norm_rope) {
      const QkNormRopeParams& r = *qk_norm_rope;
      r.validate();
      LS_OP_REQUIRE(!silu_mul && r.qkv == y && r.tokens == rows && r.row_stride() == out_features &&
                        r.dtype == act_dtype,
                    "linear", "the q/k norm + RoPE stage must read y ([rows, {}]) and be the only output stage",
                    out_features);
    }
  }
};

namespace cpu {
void linear(const LinearParams& p);
}

}  // namespace lockstep
