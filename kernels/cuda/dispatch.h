// Run-time to compile-time dispatch, in one place: element type (float32,
// bfloat16, float16) and head_dim (8 .. 256, powers of two). Anything else fails loudly,
// naming the op and the value.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

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

// Calls f(std::integral_constant<int, HD>{}) for the supported head sizes.
template <typename F>
void dispatch_head_dim(int64_t head_dim, const char* op, F&& f) {
  switch (head_dim) {
    case 8: f(std::integral_constant<int, 8>{}); return;
    case 16: f(std::integral_constant<int, 16>{}); return;
    case 32: f(std::integral_constant<int, 32>{}); return;
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    case 256: f(std::integral_constant<int, 256>{}); return;
    default: break;
  }
  LS_FAIL(ErrorKind::kModel, "{}: head_dim {} is not supported by the CUDA backend (8, 16, 32, 64, 128 or 256)", op, head_dim);
}

}  // namespace lockstep::cuda
