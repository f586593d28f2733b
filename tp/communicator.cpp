#include "tp/communicator.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "tp/watchdog.h"

namespace lockstep {

namespace {

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "single-rank"; }
  bool capturable() const override { return true; }
  void all_reduce_sum(void*, int64_t, DType) override {}
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (send != recv) std::memmove(recv, send, static_cast<size_t>(count) * dtype_size(dtype));
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(int exit_code) override { std::exit(exit_code); }
};

#define LS_CHECK_MPI(stmt)                                                                      \
  do {                                                                                          \
    int ls_mpi_rc = (stmt);                                                                     \
    if (ls_mpi_rc != MPI_SUCCESS) {                                                             \
      char ls_mpi_msg[MPI_MAX_ERROR_STRING];                                                    \
      int ls_mpi_len = 0;                                                                       \
      MPI_Error_string(ls_mpi_rc, ls_mpi_msg, &ls_mpi_len);                                     \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kMpi, #stmt,                       \
                                      std::string(ls_mpi_msg, static_cast<size_t>(ls_mpi_len)), \
                                      __FILE__, __LINE__);                                      \
    }                                                                                           \
  } while (0)

// Broadcasts and barriers happen at start-up, where a rank waits for the
// slowest rank to finish reading its weights.
constexpr std::chrono::milliseconds kStartupTimeout(30 * 60 * 1000);

// MPI counts are int: split larger transfers.
constexpr int64_t kMaxMpiCount = 1 << 30;

// Arms the watchdog for the duration of one blocking collective.
class Deadline {
 public:
  Deadline(CollectiveWatchdog& w, const char* what, std::optional<std::chrono::milliseconds> timeout = std::nullopt)
      : w_(w) {
    w_.wait_begins(what, timeout);
  }
  ~Deadline() { w_.wait_ends(); }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

 private:
  CollectiveWatchdog& w_;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(double timeout_s)
      : watchdog_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                  [] { return std::optional<std::string>(); },
                  [this](const std::string& m) {
                    end_process_after_collective_failure(fmt::format("rank {}: MPI {}", rank_, m));
                  }) {
    LS_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    LS_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  void all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    LS_REQUIRE(dtype == DType::kF32, ErrorKind::kInternal,
               "MPI all-reduce supports float32 host buffers, got {}", dtype_name(dtype));
    auto* p = static_cast<float*>(buf);
    Deadline d(watchdog_, "all-reduce");
    for (int64_t done = 0; done < count; done += kMaxMpiCount) {
      int n = static_cast<int>(std::min(kMaxMpiCount, count - done));
      LS_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, p + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    }
  }

  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    int64_t bytes = count * static_cast<int64_t>(dtype_size(dtype));
    LS_REQUIRE(bytes <= kMaxMpiCount, ErrorKind::kInternal, "all-gather block of {} bytes too large", bytes);
    Deadline d(watchdog_, "all-gather");
    LS_CHECK_MPI(MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                               MPI_BYTE, MPI_COMM_WORLD));
  }

  void broadcast(void* buf, int64_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(buf);
    Deadline d(watchdog_, "broadcast", kStartupTimeout);
    for (int64_t done = 0; done < bytes; done += kMaxMpiCount) {
      int n = static_cast<int>(std::min(kMaxMpiCount, bytes - done));
      LS_CHECK_MPI(MPI_Bcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD));
    }
  }

  void broadcast_unhurried(void* buf, int64_t bytes, int root) override {
    auto* p = static_cast<uint8_t*>(buf);
    for (int64_t done = 0; done < bytes; done += kMaxMpiCount) {
      int n = static_cast<int>(std::min(kMaxMpiCount, bytes - done));
      MPI_Request request = MPI_REQUEST_NULL;
      LS_CHECK_MPI(MPI_Ibcast(p + done, n, MPI_BYTE, root, MPI_COMM_WORLD, &request));
      for (int finished = 0;;) {
        LS_CHECK_MPI(MPI_Test(&request, &finished, MPI_STATUS_IGNORE));
        if (finished) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  }

  void barrier() override {
    Deadline d(watchdog_, "barrier", kStartupTimeout);
    LS_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  }

  [[noreturn]] void abort(int exit_code) override {
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::exit(exit_code);
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  CollectiveWatchdog watchdog_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator() {
  return std::make_unique<SingleRankCommunicator>();
}

std::unique_ptr<Communicator> make_mpi_communicator(double collective_timeout_s) {
  LS_REQUIRE(collective_timeout_s > 0, ErrorKind::kInvalidArgument, "--collective-timeout must be positive, got {}",
             collective_timeout_s);
  return std::make_unique<MpiCommunicator>(collective_timeout_s);
}

void end_process_after_collective_failure(const std::string& message) {
  spdlog::error("{}: {}", error_kind_name(ErrorKind::kRankFailure), message);
  spdlog::default_logger()->flush();
  std::fflush(stdout);
  std::_Exit(4);
}

void verify_same_on_all_ranks(Communicator& comm, uint64_t local_checksum, const std::string& what) {
  std::vector<uint64_t> all(static_cast<size_t>(comm.size()));
  // Gathered as two 4-byte elements per rank: the transports move bytes.
  comm.all_gather(&local_checksum, all.data(), 2, DType::kF32);
  std::string differing;
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0]) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  LS_REQUIRE(differing.empty(), ErrorKind::kRankFailure,
             "{} differs between rank 0 and rank(s) {} (checksum {:016x} on rank 0)", what, differing,
             all[0]);
}

int64_t min_over_ranks(Communicator& comm, int64_t local) {
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&local, all.data(), 2, DType::kF32);  // 8 bytes a rank, as above
  return *std::min_element(all.begin(), all.end());
}

}  // namespace lockstep
