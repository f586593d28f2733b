// The tensor-core attention kernel's tiles in shared memory and its
// S = Q·Kᵀ step (attention.cu has the kernel and describes the design): key
// and value tiles, where a warp keeps its query fragments, and the scores of
// a warp's 16 rows against a tile's keys on mma.m16n8k16, whatever head_dim
// from 16 to 256 (a multiple of 8 that is not one of 16 ends in half a k step).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/mma.cuh"

namespace lockstep::cuda::attention_detail {

constexpr int kTcThreads = 128;
constexpr int kTcKeys = 64;

// Elements between rows of keys, values or queries in shared memory: padded
// to an odd count of 16-byte chunks, so that ldmatrix's eight row addresses
// fall in different banks.
template <int HD>
constexpr int tc_row_pitch() {
  return HD % 16 == 0 ? HD + 8 : HD + 16;
}

// A head size that is a multiple of 8 but not of 16 ends in half a k step
// (8 dimensions; the other 8 of the step are zeros) and an odd count of
// 8-wide output tiles.
template <int HD>
constexpr bool kHalfStep = HD % 16 != 0;

template <typename T, int HD>
struct TcTile {
  static constexpr int kLd = tc_row_pitch<HD>();
  T k[kTcKeys][kLd];
  T v[kTcKeys][kLd];
};

// Where a warp keeps its 16 query rows' A fragments. Up to head_dim 128 in
// registers, loaded once (TcQueryRegs). Above it, in prefill, the fragments
// and the output accumulators would not fit the 255 registers together
// (ptxas: 1.1 KB of spill loads at 256): the block's 64 rows wait in shared
// memory, after its key tiles, and each k step reads its fragment again
// (TcQuerySmem).
template <int HD>
struct TcQueryRegs {
  static constexpr bool kInSmem = false;
  uint32_t f[(HD + 15) / 16][4];
};

template <typename T, int HD>
struct TcQuerySmem {
  static constexpr bool kInSmem = true;
  static constexpr int kLd = tc_row_pitch<HD>();
  const T* warp_rows;  // the warp's 16 rows
  __device__ void fragment(int ks, uint32_t (&a)[4]) const {
    const int lane = threadIdx.x % 32;  // lanes 0-15: rows 0-15 at k 0-7; lanes 16-31: at k 8-15
    ldmatrix_x4<false>(a, warp_rows + (lane % 16) * kLd + 16 * ks + 8 * (lane / 16));
  }
  // The half k step: dimensions 16·ks .. +7, zeros for the other 8.
  __device__ void half_fragment(int ks, uint32_t (&a)[4]) const {
    const int lane = threadIdx.x % 32;  // lanes 0-15: rows 0-15 (lanes 16-31 not read)
    uint32_t lo[2];
    ldmatrix_x2(lo, warp_rows + (lane % 16) * kLd + 16 * ks);
    a[0] = lo[0], a[1] = lo[1], a[2] = 0u, a[3] = 0u;
  }
};

template <typename T, int HD, bool InSmem>
struct TcQueryFor {
  using type = TcQueryRegs<HD>;
};
template <typename T, int HD>
struct TcQueryFor<T, HD, true> {
  using type = TcQuerySmem<T, HD>;
};
template <typename T, int HD, int RowWarps>
using TcQuery = typename TcQueryFor<T, HD, RowWarps == 4 && (HD > 128)>::type;

// The half k step of a head size that is not a multiple of 16, for keys
// key0 .. key0 + 7 of a tile: the keys' last 8 dimensions (lanes 8-15 name
// the same rows, never the padding) and zeros for the step's other 8; `qa`
// holds zeros there too.
template <typename T, int HD>
__device__ void mma_half_step(const TcTile<T, HD>& s, int key0, const uint32_t (&qa)[4], float (&sc)[4]) {
  const int lane = threadIdx.x % 32;
  uint32_t b[2];
  ldmatrix_x2(b, &s.k[key0 + lane % 8][HD / 16 * 16]);
  mma_16816<T>(sc, qa, b[0], 0u);
}

// S = Q·Kᵀ for a warp's 16 rows and keys [k0, k0 + Keys) of a tile.
// Fragments in registers: key group by key group, every k step of each.
template <typename T, int HD, int Keys>
__device__ void tc_scores_by_key_group(const TcTile<T, HD>& s, int k0, const TcQueryRegs<HD>& q,
                                       float (&sc)[Keys / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
    for (int ks = 0; ks + 1 < HD / 16; ks += 2) {
      uint32_t b[4];
      ldmatrix_x4<false>(b, &s.k[k0 + 8 * j + lane % 8][16 * ks + 8 * (lane / 8)]);
      mma_16816<T>(sc[j], q.f[ks], b[0], b[1]);
      mma_16816<T>(sc[j], q.f[ks + 1], b[2], b[3]);
    }
    if constexpr (HD / 16 % 2 == 1) {  // the last 16 dimensions alone (e.g. head_dim 80)
      constexpr int ks = HD / 16 - 1;
      uint32_t b[2];
      ldmatrix_x2(b, &s.k[k0 + 8 * j + lane % 8][16 * ks + 8 * (lane / 8 % 2)]);
      mma_16816<T>(sc[j], q.f[ks], b[0], b[1]);
    }
    if constexpr (kHalfStep<HD>) mma_half_step(s, k0 + 8 * j, q.f[HD / 16], sc[j]);
  }
}

// The same from fragments in shared memory: k step by k step (two at a
// time), so that each query fragment is read once a tile.
template <typename T, int HD, int Keys, typename Query>
__device__ void tc_scores_by_k_step(const TcTile<T, HD>& s, int k0, const Query& q, float (&sc)[Keys / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < Keys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] = 0.0f;
#pragma unroll
  for (int ks = 0; ks + 1 < HD / 16; ks += 2) {
    uint32_t qa[4], qb[4];
    q.fragment(ks, qa);
    q.fragment(ks + 1, qb);
#pragma unroll
    for (int j = 0; j < Keys / 8; ++j) {
      uint32_t b[4];
      ldmatrix_x4<false>(b, &s.k[k0 + 8 * j + lane % 8][16 * ks + 8 * (lane / 8)]);
      mma_16816<T>(sc[j], qa, b[0], b[1]);
      mma_16816<T>(sc[j], qb, b[2], b[3]);
    }
  }
  if constexpr (HD / 16 % 2 == 1) {  // the last 16 dimensions alone (e.g. head_dim 176)
    constexpr int ks = HD / 16 - 1;
    uint32_t qa[4];
    q.fragment(ks, qa);
#pragma unroll
    for (int j = 0; j < Keys / 8; ++j) {
      uint32_t b[2];
      ldmatrix_x2(b, &s.k[k0 + 8 * j + lane % 8][16 * ks + 8 * (lane / 8 % 2)]);
      mma_16816<T>(sc[j], qa, b[0], b[1]);
    }
  }
  if constexpr (kHalfStep<HD>) {
    uint32_t qa[4];
    q.half_fragment(HD / 16, qa);
#pragma unroll
    for (int j = 0; j < Keys / 8; ++j) mma_half_step(s, k0 + 8 * j, qa, sc[j]);
  }
}

}  // namespace lockstep::cuda::attention_detail
