// out = silu(gate) · up over [rows, inter], gate and up halves of each row.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

// Each thread handles N consecutive elements of one row (inter % N == 0).
template <typename T, int N>
__global__ void silu_mul_kernel(const T* gate_up, T* out, int64_t rows, int64_t inter) {
  start_after_producers();
  using V = Vec<T, N>;
  const int64_t per_row = inter / N;
  const int64_t total = rows * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row;
    const int64_t c = (i % per_row) * N;
    V g, u, o;
    g.load(gate_up + r * 2 * inter + c);
    u.load(gate_up + r * 2 * inter + inter + c);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      o.set(k, silu_mul_value(g.get(k), u.get(k)));
    }
    o.store(out + r * inter + c);
  }
}

template <typename T, int N>
void launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  const int64_t work = p.rows * (p.inter / N);
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>(ceil_div(work, threads), 132 * 16);
  LS_LAUNCH("silu_mul_kernel", silu_mul_kernel<T, N>, dim3(static_cast<unsigned>(blocks)), dim3(threads), 0, stream,
            static_cast<const T*>(p.gate_up), static_cast<T*>(p.out), p.rows, p.inter);
}

}  // namespace

void silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  p.validate();
  if (p.rows == 0) return;
  dispatch_dtype(p.dtype, "silu_mul", [&](auto t) {
    using T = decltype(t);
    if (p.inter % kVec16<T> == 0)
      launch_silu_mul<T, kVec16<T>>(p, stream);
    else
      launch_silu_mul<T, 1>(p, stream);
  });
}

}  // namespace lockstep::cuda
