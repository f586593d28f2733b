#include "launch/world.h"

#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <iterator>
#include <utility>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace lockstep::cli {

namespace {

World g_world;

// The one place that reads the launcher's environment: Open MPI, MPICH/Hydra
// and PMIx launchers each set one of these in every rank they start.
bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var) != nullptr) return true;
  return false;
}

}  // namespace

World& world() { return g_world; }

World& init_world(int* argc, char*** argv) {
  World& w = g_world;
  if (launched_by_mpi()) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    // Errors come back as codes and become typed exceptions (LS_CHECK_MPI).
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    w.mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w.size);
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &w.local_rank);
    MPI_Comm_size(local, &w.local_size);
    MPI_Comm_free(&local);
  }
  process_identity().rank = w.rank;
  process_identity().world_size = w.size;
  return w;
}

void connect_world(double collective_timeout_s) {
  g_world.collective_timeout_s = collective_timeout_s;
  g_world.comm = g_world.size > 1 ? make_mpi_communicator(collective_timeout_s) : make_single_rank_communicator();
}

void finalize_world() {
  g_world.comm.reset();
  if (g_world.mpi) MPI_Finalize();
}

void abort_world(int code) {
  spdlog::default_logger()->flush();
  if (g_world.mpi && g_world.size > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (g_world.mpi) MPI_Finalize();
  std::exit(code);
}

void require_stdout_written() {
  std::cout.flush();  // errno: the failed write's (the stream's operator<< left it)
  if (!std::cout.bad() && std::fflush(stdout) == 0 && !std::ferror(stdout)) return;
  const int e = errno;
  LS_FAIL(ErrorKind::kIo, "cannot write to standard output: {}",
          e == EPIPE ? "its reader has closed it" : e != 0 ? std::strerror(e) : "a write failed");
}

void init_logging() {
  auto logger = spdlog::stderr_color_mt("lockstep");
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", g_world.rank));
  spdlog::set_default_logger(logger);
}

void set_log_level(const std::string& level, bool level_given) {
  // By name, not through spdlog's own names (which spell warn "warning" and
  // map any unknown word to off).
  constexpr std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug}, {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn}, {"error", spdlog::level::err},
      {"off", spdlog::level::off}};
  const auto it = std::find_if(std::begin(kLevels), std::end(kLevels), [&](const auto& l) { return level == l.first; });
  if (it == std::end(kLevels))
    LS_FAIL(ErrorKind::kInvalidArgument, "unknown --log-level '{}' (trace, debug, info, warn, error, off)", level);
  spdlog::level::level_enum lvl = it->second;
  if (g_world.rank != 0 && !level_given) lvl = spdlog::level::warn;
  spdlog::set_level(lvl);
}

}  // namespace lockstep::cli
