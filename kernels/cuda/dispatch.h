// Run-time to compile-time dispatch, in one place: element type (float32,
// bfloat16, float16) and head_dim (supported_head_dim). Anything else fails
// loudly, naming the op and the value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
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

// The head sizes the CUDA attention kernels are built for: every multiple of
// kHeadDimStep (their 16-byte vector loads of 16-bit values) up to
// kMostHeadDim (head_dim 8, 16, ..., 256: published Llama/Mistral/Qwen-style
// checkpoints use 64-256).
constexpr int kHeadDimStep = 8;
constexpr int kMostHeadDim = 256;

constexpr bool supported_head_dim(int64_t hd) { return hd > 0 && hd % kHeadDimStep == 0 && hd <= kMostHeadDim; }

// Fails naming the op and the value when the CUDA backend has no attention for head_dim.
inline void require_head_dim(int64_t head_dim, const char* op) {
  LS_REQUIRE(supported_head_dim(head_dim), ErrorKind::kModel,
             "{}: head_dim {} is not supported by the CUDA backend (multiples of {} up to {})", op, head_dim,
             kHeadDimStep, kMostHeadDim);
}

// Calls f(std::integral_constant<int, HD>{}) for head_dim == HD, a supported head size.
template <typename F, int... Steps>
void call_with_head_dim(int64_t head_dim, F&& f, std::integer_sequence<int, Steps...>) {
  ((head_dim == (Steps + 1) * kHeadDimStep ? (f(std::integral_constant<int, (Steps + 1) * kHeadDimStep>{}), 0) : 0),
   ...);
}

template <typename F>
void dispatch_head_dim(int64_t head_dim, const char* op, F&& f) {
  require_head_dim(head_dim, op);
  call_with_head_dim(head_dim, std::forward<F>(f), std::make_integer_sequence<int, kMostHeadDim / kHeadDimStep>{});
}

}  // namespace lockstep::cuda
