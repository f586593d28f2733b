// The CHECK family for CUDA and cuBLAS calls, and the one kernel-launch
// helper: every launch goes through LS_LAUNCH, which checks the last error.
//
// Launches overlap (programmatic dependent launch, sm_90): a kernel may be
// scheduled while the one before it in the stream still runs, which hides
// the launch gap between the small kernels of a decode step. The contract
// for every kernel launched through LS_LAUNCH: call wait_for_producers()
// (device_math.cuh) before reading or writing anything another kernel
// touches; before it, only index math and reads of what no kernel writes
// (the weights).
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

// Launches `kernel` and checks the launch; use through LS_LAUNCH so that a
// failure reports the caller's file and line. Empty grids launch nothing.
template <typename... KernelArgs, typename... Args>
void launch_checked(const char* file, int line, const char* name, void (*kernel)(KernelArgs...), dim3 grid,
                    dim3 block, size_t smem, cudaStream_t stream, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = overlapped_launches() ? 1 : 0;
  cudaError_t status = cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
  if (status == cudaSuccess) status = cudaGetLastError();
  if (status != cudaSuccess) throw_check_failure(ErrorKind::kCuda, name, cudaGetErrorString(status), file, line);
}

}  // namespace lockstep::cuda

// LS_LAUNCH("name", kernel, grid, block, smem, stream, args...)
#define LS_LAUNCH(...) ::lockstep::cuda::launch_checked(__FILE__, __LINE__, __VA_ARGS__)
#endif
