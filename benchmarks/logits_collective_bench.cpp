// Which collective should pick the next token under a vocab-parallel LM head?
// (a) all-gather the float32 logits so every rank samples from the same full
//     row (what lockstep does: it also serves --dump-logits and top-k/top-p);
// (b) a distributed greedy argmax: each rank's local (max, index), reduced
//     with MPI_MAXLOC - only valid for greedy decoding.
// Run: mpirun -np N build/logits_collective_bench [vocab] [rows] [iters]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long vocab = argc > 1 ? std::atol(argv[1]) : 128256;
  const long rows = argc > 2 ? std::atol(argv[2]) : 1;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 200;
  const long local = (vocab + size - 1) / size;
  std::vector<float> logits(static_cast<size_t>(rows * local)), gathered(static_cast<size_t>(rows * local * size));
  std::mt19937 rng(static_cast<unsigned>(rank));
  for (auto& x : logits) x = std::uniform_real_distribution<float>(-5, 5)(rng);
  struct MaxLoc {
    float value;
    int index;
  };
  std::vector<MaxLoc> mine(static_cast<size_t>(rows)), best(static_cast<size_t>(rows));
  auto time = [&](auto&& body) {
    for (int i = 0; i < 10; ++i) body();
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) body();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
  };
  double gather_us = time([&] {
    MPI_Allgather(logits.data(), static_cast<int>(rows * local), MPI_FLOAT, gathered.data(),
                  static_cast<int>(rows * local), MPI_FLOAT, MPI_COMM_WORLD);
  });
  double argmax_us = time([&] {
    for (long r = 0; r < rows; ++r) {
      const float* row = &logits[static_cast<size_t>(r * local)];
      long i = std::max_element(row, row + local) - row;
      mine[static_cast<size_t>(r)] = {row[i], static_cast<int>(rank * local + i)};
    }
    MPI_Allreduce(mine.data(), best.data(), static_cast<int>(rows), MPI_FLOAT_INT, MPI_MAXLOC, MPI_COMM_WORLD);
  });
  if (rank == 0)
    std::printf("ranks %d vocab %ld rows %ld: all-gather of logits %.1f us, distributed argmax %.1f us\n", size, vocab,
                rows, gather_us, argmax_us);
  MPI_Finalize();
  return 0;
}
