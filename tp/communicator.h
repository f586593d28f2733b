// The tensor-parallel group's transport. One interface, several transports:
// a single-rank communicator whose collectives are no-ops (TP=1 runs the same
// code as TP=N), and MPI (host buffers). NCCL plugs in behind the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/dtype.h"

namespace lockstep {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // In-place elementwise sum over all ranks.
  virtual void all_reduce_sum(void* buf, int64_t count, DType dtype) = 0;
  // recv holds size() blocks of `count` elements, block r from rank r. The
  // single-rank communicator copies send to recv with memmove: host memory only.
  virtual void all_gather(const void* send, void* recv, int64_t count, DType dtype) = 0;
  virtual void broadcast(void* buf, int64_t bytes, int root) = 0;
  // A host broadcast whose root may take as long as a person at a keyboard:
  // no deadline, and the other ranks sleep between checks instead of
  // spinning (MPI). By default the plain broadcast.
  virtual void broadcast_unhurried(void* buf, int64_t bytes, int root) { broadcast(buf, bytes, root); }
  virtual void barrier() = 0;
  // Ends every rank of the job; never returns.
  [[noreturn]] virtual void abort(int exit_code) = 0;
  // The host is about to wait for (stops waiting for) work that contains
  // collectives; a transport with a watchdog ends the job when the wait
  // outlasts the collective timeout. No-ops by default.
  virtual void wait_begins(const char* /*what*/) {}
  virtual void wait_ends() {}
  // True when the collectives are stream-ordered device work that a CUDA
  // graph can capture (NCCL, or none at all); false for host transports.
  virtual bool capturable() const { return false; }
};

std::unique_ptr<Communicator> make_single_rank_communicator();

// Requires MPI to be initialized (launch/ does it). Uses MPI_COMM_WORLD. A
// collective that has not completed after collective_timeout_s (a peer that
// stopped or hangs) ends this rank, and with it the job, naming the collective.
std::unique_ptr<Communicator> make_mpi_communicator(double collective_timeout_s);

// Ends this process at once after a failure that other threads may be stuck
// behind (logs the message first); mpirun then ends the whole job.
[[noreturn]] void end_process_after_collective_failure(const std::string& message);

// The checksums verify_same_on_all_ranks compares: FNV-1a over `n` bytes,
// continuing `h` (start from kFnvOffset).
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
inline uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  return h;
}

// Compares a checksum across ranks (all-gather) and throws kRankFailure naming
// the ranks that disagree with rank 0 and what was compared.
void verify_same_on_all_ranks(Communicator& comm, uint64_t local_checksum, const std::string& what);

// The smallest of the ranks' values (host memory; every rank gets it), so
// that sizes each rank derives from its own machine agree across the group.
int64_t min_over_ranks(Communicator& comm, int64_t local);

}  // namespace lockstep
