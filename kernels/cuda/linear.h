// Linear layers on the GPU: y = x·Wᵀ (+ bias) with x, W and y
// in one 16-bit type (bf16 or f16; float32 for --dtype float32) and float32
// accumulation, and the op's optional input norm and SiLU·mul stages
// (kernels/linear.h). cuBLASLt needs a handle, a workspace and a plan per shape:
// LinearContext holds them (one per backend); linear() is the launcher.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "kernels/linear.h"

namespace lockstep::cuda {

class LinearContext {
 public:
  LinearContext();  // on the current device
  ~LinearContext();
  LinearContext(const LinearContext&) = delete;
  LinearContext& operator=(const LinearContext&) = delete;

  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // rows, in, out, x stride, dtype, bias, alignments of x, W, y (bytes).
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int, bool, int, int, int>;
  const Plan& plan(const LinearParams& p);
  // Up to `max` algorithms cuBLASLt's heuristic offers for p's product, its
  // first choice (the plan's) first; and a way to make another one the
  // plan's. For benchmarks/linear_bench, which times them.
  std::vector<cublasLtMatmulAlgo_t> algorithms(const LinearParams& p, int max);
  void set_algorithm(const LinearParams& p, const cublasLtMatmulAlgo_t& algo);
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }
  // Scratch for the 1-2 input rows of a GEMV with a folded input norm.
  void* normed() const { return normed_; }
  size_t normed_bytes() const;

 private:
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  void* normed_ = nullptr;
  static Key key(const LinearParams& p);
  std::vector<cublasLtMatmulAlgo_t> heuristic(const Plan& plan, const Key& key, int max);
  std::map<Key, Plan> plans_;
};

// The launcher: queues y = x·Wᵀ (+ bias) on `stream`.
void linear(const LinearParams& p, LinearContext& ctx, cudaStream_t stream);

}  // namespace lockstep::cuda
