// The CHECK family for CUDA and cuBLAS calls, and the one kernel-launch
// helper: every launch goes through LS_LAUNCH, which checks the last error.
//
// Launches overlap (programmatic dependent launch, sm_90): a kernel may be
// scheduled while the one before it in the stream still runs, which hides
// the launch gap between the small kernels of a decode step. The contract
// for every kernel launched through LS_LAUNCH: call wait_for_producers()
// (device_math.cuh) before reading or writing anything another kernel
// touches; before it, only index math and reads of what no kernel writes
// (the weights, the batch arrays a copy fills before the step). Every kernel
// lets the next one launch only after its own wait, so a kernel's early
// reads overlap its producer alone, and everything before that has finished:
// decode attention relies on this to read, before its wait, the keys below a
// token's own position, which no kernel of a batch with no lower writes
// touches (AttentionParams::no_lower_writes).
// A failure throws a lockstep::Error naming the statement (or kernel), the
// error string, the rank, the device and file:line.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "common/error.h"

#define LS_CHECK_CUDA(stmt)                                                                       \
  do {                                                                                            \
    cudaError_t ls_cuda_status_ = (stmt);                                                         \
    if (ls_cuda_status_ != cudaSuccess)                                                           \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kCuda, #stmt,                        \
                                      cudaGetErrorString(ls_cuda_status_), __FILE__, __LINE__);   \
  } while (0)

#define LS_CHECK_CUBLAS(stmt)                                                                     \
  do {                                                                                            \
    cublasStatus_t ls_cublas_status_ = (stmt);                                                    \
    if (ls_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kCublas, #stmt,                      \
                                      cublasGetStatusString(ls_cublas_status_), __FILE__, __LINE__); \
  } while (0)

namespace lockstep::cuda {

// Whether launches may overlap (on by default; set once at start-up, e.g.
// off to rule the overlap out while debugging).
void set_overlapped_launches(bool on);
bool overlapped_launches();

}  // namespace lockstep::cuda

#ifdef __CUDACC__
namespace lockstep::cuda {

// Launches `kernel` in clusters of `cluster_blocks` blocks along x (1: no
// clusters; sm_90 and later otherwise) and checks the launch; use through
// LS_LAUNCH or LS_LAUNCH_CLUSTERED so that a failure reports the caller's
// file and line. Empty grids launch nothing.
template <typename... KernelArgs, typename... Args>
void launch_checked_clustered(const char* file, int line, const char* name, void (*kernel)(KernelArgs...), dim3 grid,
                              dim3 block, unsigned cluster_blocks, size_t smem, cudaStream_t stream, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  cudaLaunchAttribute attrs[2]{};
  unsigned count = 0;
  if (overlapped_launches()) {
    attrs[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_blocks > 1) {
    attrs[count].id = cudaLaunchAttributeClusterDimension;
    attrs[count++].val.clusterDim = {cluster_blocks, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = count;
  cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
  // A refused launch also sets the last error: taking it here keeps the next launch from being blamed.
  const cudaError_t last = cudaGetLastError();
  if (status == cudaSuccess) status = last;
  if (status != cudaSuccess) throw_check_failure(ErrorKind::kCuda, name, cudaGetErrorString(status), file, line);
}

template <typename... KernelArgs, typename... Args>
void launch_checked(const char* file, int line, const char* name, void (*kernel)(KernelArgs...), dim3 grid,
                    dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  launch_checked_clustered(file, line, name, kernel, grid, block, 1, smem, stream, args...);
}

}  // namespace lockstep::cuda

// LS_LAUNCH("name", kernel, grid, block, smem, stream, args...)
#define LS_LAUNCH(...) ::lockstep::cuda::launch_checked(__FILE__, __LINE__, __VA_ARGS__)
// LS_LAUNCH_CLUSTERED("name", kernel, grid, block, cluster_blocks, smem, stream, args...)
#define LS_LAUNCH_CLUSTERED(...) ::lockstep::cuda::launch_checked_clustered(__FILE__, __LINE__, __VA_ARGS__)
#endif
