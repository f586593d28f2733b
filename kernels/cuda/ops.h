// The CUDA ops: one launcher per op, taking the same parameter struct as the
// CPU twin (kernels/<op>.h) plus the stream to queue on. Element types:
// float32, bfloat16 and float16; all arithmetic accumulates in float32.
// Every launcher validates its struct and checks its launches.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/next_tokens.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/silu_mul.h"

namespace lockstep::cuda {

void embedding(const EmbeddingParams& p, cudaStream_t stream);
void rms_norm(const RmsNormParams& p, cudaStream_t stream);
void qk_norm_rope(const QkNormRopeParams& p, cudaStream_t stream);
void silu_mul(const SiluMulParams& p, cudaStream_t stream);

// The row scale of a folded input norm and the bias after it
// (LinearParams::input_rms), for the output stage after a cuBLASLt product
// that wrote x·Wᵀ alone: the stage takes each value of row r as
// round(value / rms(x[r, :]) + bias) before its own work.
struct RowScale {
  const void* x = nullptr;     // [rows, cols], the product's input
  int64_t cols = 0;
  float eps = 0.0f;
  const void* bias = nullptr;  // [the stage's row width] or null
};
void qk_norm_rope(const QkNormRopeParams& p, const RowScale* scale, cudaStream_t stream);
void silu_mul(const SiluMulParams& p, const RowScale* scale, cudaStream_t stream);
void argmax(const ArgmaxParams& p, cudaStream_t stream);
void sample(const SampleParams& p, cudaStream_t stream);
void next_tokens(const NextTokensParams& p, cudaStream_t stream);

// Attention splits each sequence over several blocks (flash-decoding) when
// the batch alone does not fill the GPU; the partial results and the splits'
// counters go to p.workspace, which must hold attention_workspace_bytes(num_sms)
// bytes and be cleared once with clear_attention_workspace before its first
// use (each attention call leaves the counters cleared).
void attention(const AttentionParams& p, int num_sms, cudaStream_t stream);
// Fails (ErrorKind::kModel, one line) when attention has no kernel for head_dim.
void require_attention_head_dim(int64_t head_dim);
int64_t attention_workspace_bytes(int num_sms);
// The decode split rules: splits per block for a split-free grid of
// `base_blocks` blocks on a GPU of `num_sms` SMs, with sequences of up to
// `max_seq` keys (host code): the fewest waves over `slots` blocks held at
// once (the CUDA-core kernel's base rule), and the tensor-core kernel's at
// one block an SM.
int attention_splits_by_waves(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms);
int attention_splits_one_block_per_sm(int64_t base_blocks, int64_t max_seq, int num_sms);
// The CUDA-core kernel's rule as launched: the waves rule, capped at one
// block an SM where its grid runs only a few blocks over that.
int attention_splits_cuda_core(int64_t base_blocks, int64_t max_seq, int64_t slots, int num_sms);
// Dynamic shared memory of a tensor-core decode launch of `blocks` blocks:
// the kernel's own (`natural_bytes`), padded where needed so that no SM of
// `smem_per_sm` bytes can hold more than ceil(blocks / num_sms) of them.
int attention_decode_tile_smem_bytes(int64_t blocks, int num_sms, int smem_per_sm, int natural_bytes);
// Unused dynamic shared memory that a CUDA-core attention launch of `blocks`
// blocks (of `own_bytes` static shared memory each) adds: enough for one
// block an SM where the grid has at most one block an SM, none otherwise.
int attention_cuda_core_padding_bytes(int64_t blocks, int num_sms, int smem_per_sm, int own_bytes);
void clear_attention_workspace(void* workspace, int num_sms, cudaStream_t stream);

}  // namespace lockstep::cuda
