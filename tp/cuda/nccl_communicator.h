// The NCCL communicator: collectives on device buffers, enqueued on the
// rank's compute stream with no events or host synchronization around them
// (so they can be captured inside the decode step's CUDA graph). The unique
// id is made on rank 0 and broadcast with MPI; the communicator is created
// non-blocking so that the watchdog can abort it.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "tp/communicator.h"

namespace lockstep {

struct NcclOptions {
  int device = 0;
  cudaStream_t stream = nullptr;        // the backend's compute stream
  double collective_timeout_s = 60.0;   // deadline of a host wait on collectives
  void validate() const;
};

// Requires MPI to be initialized when the world has more than one rank.
std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options);

// Host staging for device buffers: wraps a host communicator (MPI) so that
// two ranks can share one GPU in tests (NCCL refuses that). Each collective
// copies device -> host, runs the host collective, and copies back, on `stream`.
std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> host, cudaStream_t stream);

}  // namespace lockstep
