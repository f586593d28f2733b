// Embedding gather (also the LM head's row gather): one block per token,
// copying the row in 16-byte pieces when the row size allows.
#include <cstdint>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

// Copies in units of U; row_units = row bytes / sizeof(U).
template <typename U>
__global__ void embedding_kernel(const int32_t* ids, const U* table, U* out, int64_t row_units, int64_t row_begin,
                                 int64_t rows_local) {
  start_after_producers();
  const int64_t t = blockIdx.x;
  const int64_t row = static_cast<int64_t>(ids[t]) - row_begin;
  U* dst = out + t * row_units;
  if (row >= 0 && row < rows_local) {
    const U* src = table + row * row_units;
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = src[i];
  } else {
    for (int64_t i = threadIdx.x; i < row_units; i += blockDim.x) dst[i] = U{};
  }
}

template <typename U>
void launch_embedding(const EmbeddingParams& p, int64_t row_bytes, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
  const int threads = static_cast<int>(std::min<int64_t>(256, (units + 31) / 32 * 32));
  LS_LAUNCH("embedding_kernel", embedding_kernel<U>, dim3(static_cast<unsigned>(p.tokens)), dim3(threads), 0, stream,
            p.ids, static_cast<const U*>(p.table), static_cast<U*>(p.out), units, p.row_begin, p.rows_local);
}

}  // namespace

void embedding(const EmbeddingParams& p, cudaStream_t stream) {
  p.validate();
  LS_OP_REQUIRE(p.table_dtype == p.dtype, "embedding", "the table's dtype ({}) must be the output's ({}) on CUDA",
                dtype_name(p.table_dtype), dtype_name(p.dtype));
  if (p.tokens == 0) return;
  const int64_t row_bytes = p.hidden * static_cast<int64_t>(dtype_size(p.dtype));
  if (row_bytes % 16 == 0)
    launch_embedding<uint4>(p, row_bytes, stream);
  else if (row_bytes % 4 == 0)
    launch_embedding<uint32_t>(p, row_bytes, stream);
  else
    launch_embedding<uint16_t>(p, row_bytes, stream);
}

}  // namespace lockstep::cuda
