// The process's place in the job, decided once at start-up: under mpirun
// (or another MPI launcher) MPI is initialized and the world size is the
// tensor-parallel size; run directly, lockstep is a single rank and MPI is
// never touched.
#pragma once

#include <memory>
#include <string>

#include "tp/communicator.h"

namespace lockstep::cli {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // among the ranks on this host (for the device mapping)
  int local_size = 1;
  bool mpi = false;
  double collective_timeout_s = 60.0;  // --collective-timeout
  std::unique_ptr<Communicator> comm;
};

// Initializes MPI when launched by an MPI launcher; fills process_identity().
World& init_world(int* argc, char*** argv);
World& world();
// Creates the tensor-parallel communicator (after the command line is parsed).
void connect_world(double collective_timeout_s);
void finalize_world();
// Ends the whole job after a failure on this rank: MPI_Abort when several
// ranks run (every rank exits non-zero), else exit(code).
[[noreturn]] void abort_world(int code);

// Fails (kIo) when what was written to standard output did not get there:
// its reader closed it (SIGPIPE is ignored, so a write fails instead of
// killing the process), or a full disk. Called after each streamed write, so
// that a run stops as soon as nobody reads it.
void require_stdout_written();

// spdlog with the rank in every line (before the command line is parsed, so
// that its errors look like every other).
void init_logging();
// Rank 0 logs at `level` (default info); other ranks log warnings and errors
// only unless a level was given.
void set_log_level(const std::string& level, bool level_given);

}  // namespace lockstep::cli
