#include "tp/cuda/nccl_communicator.h"

#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "tp/watchdog.h"

#define LS_CHECK_NCCL_CALL(stmt)                                                                         \
  do {                                                                                                   \
    ncclResult_t ls_nccl_rc = (stmt);                                                                    \
    if (ls_nccl_rc != ncclSuccess && ls_nccl_rc != ncclInProgress)                                       \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kNccl, #stmt, ncclGetErrorString(ls_nccl_rc), \
                                      __FILE__, __LINE__);                                               \
  } while (0)

#define LS_CHECK_CUDA_CALL(stmt)                                                                         \
  do {                                                                                                   \
    cudaError_t ls_cuda_rc = (stmt);                                                                     \
    if (ls_cuda_rc != cudaSuccess)                                                                       \
      ::lockstep::throw_check_failure(::lockstep::ErrorKind::kCuda, #stmt, cudaGetErrorString(ls_cuda_rc), \
                                      __FILE__, __LINE__);                                               \
  } while (0)

namespace lockstep {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32: return ncclFloat;
    case DType::kF16: return ncclHalf;
    case DType::kBF16: return ncclBfloat16;
  }
  return ncclFloat;
}

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(const NcclOptions& o) : stream_(o.stream), timeout_s_(o.collective_timeout_s) {
    world_rank_size();
    ncclUniqueId id;
    if (rank_ == 0) LS_CHECK_NCCL_CALL(ncclGetUniqueId(&id));
    if (size_ > 1) MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    LS_CHECK_CUDA_CALL(cudaSetDevice(o.device));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // non-blocking: ncclCommAbort can always interrupt it
    LS_CHECK_NCCL_CALL(ncclCommInitRankConfig(&comm_, size_, id, rank_, &config));
    settle("ncclCommInitRankConfig", std::chrono::duration<double>(o.collective_timeout_s * 10));
    watchdog_ = std::make_unique<CollectiveWatchdog>(
        std::chrono::milliseconds(static_cast<int64_t>(o.collective_timeout_s * 1000)),
        [this] { return async_error(); },
        // No ncclCommAbort on the way out: like ncclCommDestroy it waits
        // for every CUDA graph that captured this communicator's
        // collectives (NCCL 2.26+), and the decode graphs are alive here.
        // Ending the process ends its kernels; mpirun ends the others.
        [this](const std::string& m) {
          end_process_after_collective_failure(fmt::format("rank {}: NCCL {}", rank_, m));
        });
  }

  // Finalizes (collective: it flushes this rank's work and synchronizes
  // with the peers), then destroys; a peer that never finalizes makes the
  // wait run into the collective timeout, and the communicator is aborted.
  // While an error unwinds (this rank alone may be failing) it aborts at
  // once. The CUDA graphs that captured its collectives must be gone by now:
  // NCCL 2.26+ waits for them in both calls (Engine destroys its backend
  // first).
  ~NcclCommunicator() override {
    watchdog_.reset();
    if (comm_ == nullptr) return;
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);
      return;
    }
    try {
      LS_CHECK_NCCL_CALL(ncclCommFinalize(comm_));
      settle("ncclCommFinalize", std::chrono::duration<double>(timeout_s_));
      ncclCommDestroy(comm_);
    } catch (const Error& e) {
      spdlog::warn("{}; aborting the communicator", e.what());
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }
  bool capturable() const override { return true; }

  void all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    enqueued(ncclAllReduce(buf, buf, static_cast<size_t>(count), nccl_type(dtype), ncclSum, comm_, stream_),
             "all-reduce");
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    enqueued(ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(dtype), comm_, stream_), "all-gather");
  }
  void broadcast(void* buf, int64_t bytes, int root) override {
    enqueued(ncclBroadcast(buf, buf, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream_), "broadcast");
  }
  void barrier() override {
    if (size_ > 1) MPI_Barrier(MPI_COMM_WORLD);
  }
  [[noreturn]] void abort(int exit_code) override {  // no ncclCommAbort: see the watchdog's callback
    if (size_ > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);
  }
  void wait_begins(const char* what) override {
    watchdog_->wait_begins(fmt::format("{} (last collective enqueued: {})", what, last_));
  }
  void wait_ends() override { watchdog_->wait_ends(); }

 private:
  void world_rank_size() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
      MPI_Comm_size(MPI_COMM_WORLD, &size_);
    }
  }

  std::optional<std::string> async_error() {
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return std::string("ncclCommGetAsyncError failed");
    if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
    return fmt::format("asynchronous error: {}", ncclGetErrorString(state));
  }

  // A non-blocking communicator may answer ncclInProgress while it enqueues
  // a collective; the next NCCL call must wait until that is done (a host
  // wait for the enqueue only, not for the collective itself).
  void enqueued(ncclResult_t rc, const char* what) {
    if (rc != ncclSuccess && rc != ncclInProgress)
      throw_check_failure(ErrorKind::kNccl, what, ncclGetErrorString(rc), __FILE__, __LINE__);
    if (rc == ncclInProgress) settle(what, std::chrono::duration<double>(timeout_s_));
    last_ = what;
  }

  // Waits for a non-blocking NCCL call to finish. An enqueue finishes in
  // microseconds: the wait spins (yielding) for its first milliseconds and
  // sleeps only after that (sleeping from the start cost every eager
  // collective ~1.1 ms, measured on two H200s).
  void settle(const char* what, std::chrono::duration<double> limit) {
    const auto start = std::chrono::steady_clock::now();
    ncclResult_t state = ncclInProgress;
    while (true) {
      LS_CHECK_NCCL_CALL(ncclCommGetAsyncError(comm_, &state));
      if (state != ncclInProgress) break;
      const auto waited = std::chrono::steady_clock::now() - start;
      LS_REQUIRE(waited < limit, ErrorKind::kNccl, "rank {}: {} did not finish", rank_, what);
      if (waited < std::chrono::milliseconds(5))
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    LS_REQUIRE(state == ncclSuccess, ErrorKind::kNccl, "rank {}: {} failed: {}", rank_, what, ncclGetErrorString(state));
  }

  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_;
  double timeout_s_;
  ncclComm_t comm_ = nullptr;
  const char* last_ = "none";
  std::unique_ptr<CollectiveWatchdog> watchdog_;
};

// Device buffers through a host communicator: D2H, host collective, H2D.
class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(std::unique_ptr<Communicator> host, cudaStream_t stream)
      : host_(std::move(host)), stream_(stream) {}
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const char* name() const override { return "mpi (host-staged device buffers)"; }

  void all_reduce_sum(void* buf, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    stage_in(buf, bytes);
    // Host collectives sum float32: widen 16-bit data, reduce, narrow back.
    f32_.resize(static_cast<size_t>(count));
    convert_to_f32(staging_.data(), dtype, f32_.data(), f32_.size());
    host_->all_reduce_sum(f32_.data(), count, DType::kF32);
    convert_from_f32(f32_.data(), staging_.data(), dtype, f32_.size());
    stage_out(buf, bytes);
  }
  void all_gather(const void* send, void* recv, int64_t count, DType dtype) override {
    const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
    stage_in(send, bytes);
    gathered_.resize(bytes * static_cast<size_t>(size()));
    host_->all_gather(staging_.data(), gathered_.data(), count, dtype);
    LS_CHECK_CUDA_CALL(cudaMemcpyAsync(recv, gathered_.data(), gathered_.size(), cudaMemcpyHostToDevice, stream_));
    LS_CHECK_CUDA_CALL(cudaStreamSynchronize(stream_));
  }
  void broadcast(void* buf, int64_t bytes, int root) override {
    stage_in(buf, static_cast<size_t>(bytes));
    host_->broadcast(staging_.data(), bytes, root);
    stage_out(buf, static_cast<size_t>(bytes));
  }
  void barrier() override { host_->barrier(); }
  [[noreturn]] void abort(int exit_code) override {
    host_->abort(exit_code);
    std::_Exit(exit_code);  // not reached: abort() never returns
  }

 private:
  void stage_in(const void* device, size_t bytes) {
    staging_.resize(bytes);
    LS_CHECK_CUDA_CALL(cudaMemcpyAsync(staging_.data(), device, bytes, cudaMemcpyDeviceToHost, stream_));
    LS_CHECK_CUDA_CALL(cudaStreamSynchronize(stream_));
  }
  void stage_out(void* device, size_t bytes) {
    LS_CHECK_CUDA_CALL(cudaMemcpyAsync(device, staging_.data(), bytes, cudaMemcpyHostToDevice, stream_));
    LS_CHECK_CUDA_CALL(cudaStreamSynchronize(stream_));
  }

  std::unique_ptr<Communicator> host_;
  cudaStream_t stream_;
  std::vector<uint8_t> staging_, gathered_;
  std::vector<float> f32_;
};

}  // namespace

void NcclOptions::validate() const {
  LS_REQUIRE(device >= 0, ErrorKind::kInvalidArgument, "device index must be >= 0, got {}", device);
  LS_REQUIRE(collective_timeout_s > 0, ErrorKind::kInvalidArgument, "--collective-timeout must be positive");
}

std::unique_ptr<Communicator> make_nccl_communicator(const NcclOptions& options) {
  options.validate();
  return std::make_unique<NcclCommunicator>(options);
}

std::unique_ptr<Communicator> make_host_staged_communicator(std::unique_ptr<Communicator> host, cudaStream_t stream) {
  return std::make_unique<HostStagedCommunicator>(std::move(host), stream);
}

}  // namespace lockstep
