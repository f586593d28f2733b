// Run-time to compile-time dispatch, in one place: element type (float32,
// bfloat16, float16) and head_dim (SupportedHeadDims). Anything else fails
// loudly, naming the op and the value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/op_common.h"

namespace lockstep::cuda {

// Calls f(T{}) with T the device type of `dtype`.
template <typename F>
void dispatch_dtype(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kF32: f(float{}); return;
    case DType::kBF16: f(__nv_bfloat16{}); return;
    case DType::kF16: f(__half{}); return;
  }
  LS_FAIL(ErrorKind::kInternal, "{}: unsupported dtype {}", op, static_cast<int>(dtype));
}

// The head sizes the CUDA attention kernels are built for: powers of two
// from 8 and the other multiples of 8 that published Llama/Mistral/Qwen-style
// checkpoints use (80, 96, 112, 120, 160, 192). Every dimension here is a
// multiple of 8, which the kernels' 16-byte vector loads need.
template <int... HDs>
struct HeadDimList {
  static constexpr bool contains(int64_t hd) { return ((hd == HDs) || ...); }
  static std::string text() {  // "8, 16, ..., 256"
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(HDs)), ...);
    return s;
  }
  // Calls f(std::integral_constant<int, HD>{}) for hd == HD; false if none.
  template <typename F>
  static bool call(int64_t hd, F&& f) {
    return ((hd == HDs ? (f(std::integral_constant<int, HDs>{}), true) : false) || ...);
  }
};
using SupportedHeadDims = HeadDimList<8, 16, 32, 64, 80, 96, 112, 120, 128, 160, 192, 256>;

// Fails naming the op and the value when the CUDA backend has no attention for head_dim.
inline void require_head_dim(int64_t head_dim, const char* op) {
  LS_REQUIRE(SupportedHeadDims::contains(head_dim), ErrorKind::kModel,
             "{}: head_dim {} is not supported by the CUDA backend ({})", op, head_dim, SupportedHeadDims::text());
}

// Calls f(std::integral_constant<int, HD>{}) for the supported head sizes.
template <typename F>
void dispatch_head_dim(int64_t head_dim, const char* op, F&& f) {
  require_head_dim(head_dim, op);
  SupportedHeadDims::call(head_dim, std::forward<F>(f));
}

}  // namespace lockstep::cuda
