// Timing for the kernel benchmarks: the mean time of a body replayed inside
// one CUDA graph, as the decode step runs its kernels.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/check.h"

namespace lockstep::bench {

// Mean time of `body(i)` in microseconds: calls i = 0 .. per_graph-1
// captured in one graph, replayed `iters` times after a warm-up replay.
template <typename Body>
inline double graphed_us(cudaStream_t stream, int per_graph, int iters, Body body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  LS_CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; ++i) body(i);
  LS_CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  LS_CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  LS_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  LS_CHECK_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  LS_CHECK_CUDA(cudaEventCreate(&start));
  LS_CHECK_CUDA(cudaEventCreate(&stop));
  LS_CHECK_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) LS_CHECK_CUDA(cudaGraphLaunch(exec, stream));
  LS_CHECK_CUDA(cudaEventRecord(stop, stream));
  LS_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0.0f;
  LS_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1000.0 * ms / (static_cast<double>(iters) * per_graph);
}

}  // namespace lockstep::bench
