// KV-cache append: each token's k and v (from its fused QKV row) go to its
// slot at its position. One block per token; 16-byte copies when the KV
// width allows. Slots and positions were checked by the runner on the host.
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

// Sizes in units of U (a multiple of the element size).
template <typename U>
__global__ void kv_append_kernel(const U* qkv, U* k_cache, U* v_cache, const int32_t* slots,
                                 const int32_t* positions, int64_t row_units, int64_t k_offset, int64_t kv_units,
                                 int64_t slot_units, int64_t position_units) {
  const int64_t t = blockIdx.x;
  const U* k = qkv + t * row_units + k_offset;
  const U* v = k + kv_units;
  const int64_t dst = slots[t] * slot_units + positions[t] * position_units;
  for (int64_t i = threadIdx.x; i < kv_units; i += blockDim.x) {
    k_cache[dst + i] = k[i];
    v_cache[dst + i] = v[i];
  }
}

template <typename U>
void launch_kv_append(const KvAppendParams& p, int64_t esize, cudaStream_t stream) {
  const KvCacheShape& c = p.cache;
  const int64_t per = static_cast<int64_t>(sizeof(U)) / esize;  // elements per unit
  const int64_t kv_units = c.num_kv_heads * c.head_dim / per;
  const int threads = static_cast<int>(std::min<int64_t>(256, (kv_units + 31) / 32 * 32));
  LS_LAUNCH("kv_append_kernel", kv_append_kernel<U>, dim3(static_cast<unsigned>(p.tokens)), dim3(threads), 0, stream,
            static_cast<const U*>(p.qkv), static_cast<U*>(p.k_cache), static_cast<U*>(p.v_cache), p.slots,
            p.positions, (p.num_heads + 2 * c.num_kv_heads) * c.head_dim / per, p.num_heads * c.head_dim / per,
            kv_units, c.slot_stride() / per, c.position_stride() / per);
}

}  // namespace

void kv_append(const KvAppendParams& p, cudaStream_t stream) {
  p.validate();
  if (p.tokens == 0) return;
  const int64_t esize = static_cast<int64_t>(dtype_size(p.dtype));
  // head_dim is even and a multiple of 8 for every supported model; the unit
  // must divide the q width, the kv width and the strides alike.
  const int64_t hd_bytes = p.cache.head_dim * esize;
  if (hd_bytes % 16 == 0)
    launch_kv_append<uint4>(p, esize, stream);
  else if (hd_bytes % 4 == 0)
    launch_kv_append<uint32_t>(p, esize, stream);
  else
    launch_kv_append<uint16_t>(p, esize, stream);
}

}  // namespace lockstep::cuda
