// Warp-level tensor-core building blocks (sm_80 and later): the m16n8k16
// matrix multiply-accumulate with float32 accumulators, ldmatrix loads of its
// fragments from shared memory, asynchronous global-to-shared copies, and
// packing two floats into one register of 16-bit operands.
//
// Fragment layout of mma.m16n8k16 (PTX ISA, "Matrix Fragments for
// mma.m16n8k16"), with g = lane / 4 and c = lane % 4:
//   A (16x16, row-major), 4 registers of 2 elements:
//     a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..], a[3] = A[g+8][2c+8..]
//   B (16x8, "col": element (k, n) read as B[k][n]), 2 registers:
//     b[0] = B[2c..2c+1][g], b[1] = B[2c+8..2c+9][g]
//   C/D (16x8 float): c[0..1] = C[g][2c..2c+1], c[2..3] = C[g+8][2c..2c+1]
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lockstep::cuda {

// d += a · b for one 16x8x16 tile; T is __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma_16816: bf16 or f16 only");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit elements; lanes 8m..8m+7 give the row
// addresses of matrix m, and r[m] receives the lane's fragment of it
// (row lane/4, columns 2(lane%4)..+1; with Trans, the transposed element pair).
template <bool Trans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row_address)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(row_address)));
  }
}

// Two 8x8 matrices: lanes 8m..8m+7 (m < 2) give the row addresses of
// matrix m; the other lanes' addresses are not read.
template <bool Trans = false>
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row_address) {
  if constexpr (Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row_address)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(shared_address(row_address)));
  }
}

// 16 bytes from global to shared memory without passing through registers;
// with `valid` false the destination is zero-filled and nothing is read.
__device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared_dst)),
               "l"(global_src), "r"(valid ? 16 : 0));
}

// The copies issued since the last commit form one group; wait_group<N>
// returns once at most N groups are still in flight (a pipeline of N + 1
// stages waits for its oldest).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Waits for the group committed `newer` groups before the newest one (at
// most Max newer groups may stay in flight): wait_group takes an immediate,
// so a pipeline of Max + 1 stages picks it at run time near its end, where
// fewer groups follow the one it needs.
template <int Max>
__device__ __forceinline__ void cp_async_wait_for(int64_t newer) {
  if constexpr (Max > 0) {
    if (newer >= Max) {
      cp_async_wait_group<Max>();
      return;
    }
    cp_async_wait_for<Max - 1>(newer);
  } else {
    cp_async_wait_group<0>();
  }
}

// Two floats as one register of two 16-bit operands (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

}  // namespace lockstep::cuda
