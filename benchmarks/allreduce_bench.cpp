// All-reduce latency and bandwidth per communicator, 2 KB - 64 MB, eager and
// (for NCCL) captured in a CUDA graph. Definitions follow nccl-tests:
//   algbw = bytes / time;  busbw = algbw * 2 (n - 1) / n.
// Run: mpirun -np N build/allreduce_bench [iterations]   (N = 1 works: TP=1)
// Communicators: nccl (device buffers, on a stream), mpi-staged (device
// buffers through host staging), mpi (host buffers).
#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "tp/communicator.h"
#include "tp/cuda/nccl_communicator.h"

namespace {

using lockstep::Communicator;
using lockstep::DType;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Row {
  std::string comm, mode;
  size_t bytes;
  double us;
};

// Median-free mean of `iters` runs after warm-up, timed on the host after a
// stream synchronize (the eager path) or around graph replays.
double time_us(int iters, cudaStream_t stream, const std::function<void()>& body) {
  for (int i = 0; i < 5; ++i) body();
  check(cudaStreamSynchronize(stream), "sync");
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) body();
  check(cudaStreamSynchronize(stream), "sync");
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double graphed_us(int iters, cudaStream_t stream, Communicator& comm, float* buf, int64_t count) {
  constexpr int kPerGraph = 20;  // collectives captured per graph
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < kPerGraph; ++i) comm.all_reduce_sum(buf, count, DType::kF32);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  double us = time_us(std::max(1, iters / kPerGraph), stream, [&] { check(cudaGraphLaunch(exec, stream), "launch"); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us / kPerGraph;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int iters = argc > 1 ? std::atoi(argv[1]) : 100;
  int devices = 0;
  check(cudaGetDeviceCount(&devices), "device count");
  const int device = rank % devices;
  check(cudaSetDevice(device), "set device");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<Row> rows;
  try {
    std::unique_ptr<Communicator> nccl;
    if (devices >= size) nccl = lockstep::make_nccl_communicator({.device = device, .stream = stream});
    auto staged = lockstep::make_host_staged_communicator(lockstep::make_mpi_communicator(60.0), stream);
    auto host = lockstep::make_mpi_communicator(60.0);
    const size_t max_bytes = 64u << 20;
    float* dbuf = nullptr;
    check(cudaMalloc(&dbuf, max_bytes), "malloc");
    check(cudaMemset(dbuf, 0, max_bytes), "memset");
    std::vector<float> hbuf(max_bytes / 4, 0.0f);
    std::vector<size_t> sizes;  // 2 KB, 8 KB, ... 32 MB, and 64 MB
    for (size_t bytes = 2048; bytes < max_bytes; bytes *= 4) sizes.push_back(bytes);
    sizes.push_back(max_bytes);
    for (size_t bytes : sizes) {
      const int64_t count = static_cast<int64_t>(bytes / 4);
      const int n = bytes >= (16u << 20) ? std::max(5, iters / 10) : iters;
      if (nccl) {
        rows.push_back({"nccl", "eager", bytes, time_us(n, stream, [&] { nccl->all_reduce_sum(dbuf, count, DType::kF32); })});
        rows.push_back({"nccl", "graph", bytes, graphed_us(n, stream, *nccl, dbuf, count)});
      }
      rows.push_back({"mpi-staged", "eager", bytes,
                      time_us(std::max(3, n / 5), stream, [&] { staged->all_reduce_sum(dbuf, count, DType::kF32); })});
      rows.push_back({"mpi", "eager", bytes, time_us(n, stream, [&] { host->all_reduce_sum(hbuf.data(), count, DType::kF32); })});
    }
    cudaFree(dbuf);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    std::printf("%-11s %-6s %10s %10s %10s %10s\n", "comm", "mode", "bytes", "time_us", "algbw_GBs", "busbw_GBs");
    for (const Row& r : rows) {
      double alg = static_cast<double>(r.bytes) / (r.us * 1e3);
      std::printf("%-11s %-6s %10zu %10.2f %10.2f %10.2f\n", r.comm.c_str(), r.mode.c_str(), r.bytes, r.us, alg,
                  alg * 2.0 * (size - 1) / size);
    }
  }
  cudaStreamDestroy(stream);
  MPI_Finalize();
  return 0;
}
