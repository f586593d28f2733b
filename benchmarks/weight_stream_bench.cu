// How fast warps stream a weight matrix from DRAM, by access pattern: the
// question behind the products of our own that lost to cuBLASLt at 3-64 rows
// (benchmarks/NOTES.md). Each warp reads rounds of 8 KB (16 loads of 16
// bytes a lane, as the GEMV and the skinny product do): R rows x B
// contiguous bytes of each, and folds them into a checksum (nothing else,
// so only the loads are timed). Units are (group of R rows, B-byte chunk);
// "chunk-major" hands consecutive warps consecutive chunks of the same rows
// (a block reads R rows x 4B contiguous, as the GEMV's blocks read rows),
// "rows-major" consecutive row groups at the same chunk (a block reads 4R
// rows x B, as the sliced skinny product did). Persistent grids of 1-8 blocks
// of 4 warps an SM stride over the units. A 256 MB bf16 matrix of 4096-wide
// rows (llama3-8b's k), four copies cycled so that L2 cannot serve them.
// Prints GB/s and % of the copy bandwidth measured in the same run.
// Run: build/weight_stream_bench
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "kernels/cuda/check.h"

namespace {

using lockstep::bench::load_streaming;
constexpr int kWarps = 4;
constexpr int64_t kRowBytes = 8192;
constexpr int64_t kMatrixBytes = int64_t{256} << 20;
constexpr int kCopies = 4;

template <int R, int B, bool ChunkMajor>
__global__ void __launch_bounds__(kWarps * 32) stream_kernel(const unsigned char* w, int64_t rows, unsigned* sink) {
  constexpr int kLoads = R * B / 512;
  static_assert(kLoads == 16, "8 KB a warp a round");
  constexpr int kLanesPerRow = B >= 512 ? 32 : B / 16;
  constexpr int kRowsPerLoad = 32 / kLanesPerRow;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t groups = rows / R, chunks = kRowBytes / B;
  unsigned acc = 0;
  for (int64_t u = warp; u < groups * chunks; u += warps) {
    const int64_t g = ChunkMajor ? u / chunks : u % groups;
    const int64_t c = ChunkMajor ? u % chunks : u / groups;
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      int64_t row, offset;
      if constexpr (B >= 512) {
        row = g * R + i / (B / 512);
        offset = c * B + (i % (B / 512)) * 512 + lane * 16;
      } else {
        row = g * R + i * kRowsPerLoad + lane / kLanesPerRow;
        offset = c * B + (lane % kLanesPerRow) * 16;
      }
      v[i] = load_streaming(w + row * kRowBytes + offset);
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) acc ^= v[i].x ^ v[i].y ^ v[i].z ^ v[i].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // never, in practice: keeps the loads
}

template <int R, int B, bool ChunkMajor>
void measure(const std::vector<unsigned char*>& copies, unsigned* sink, cudaStream_t stream, int sms, double copy) {
  const int64_t rows = kMatrixBytes / kRowBytes;
  std::printf("%3d rows x %5d B  %-11s", R, B, ChunkMajor ? "chunk-major" : "rows-major");
  for (int per_sm : {1, 2, 3, 4, 8}) {
    const dim3 grid(static_cast<unsigned>(sms * per_sm));
    const auto launch = [&](int i) {
      stream_kernel<R, B, ChunkMajor><<<grid, kWarps * 32, 0, stream>>>(copies[i % kCopies], rows, sink);
      LS_CHECK_CUDA(cudaGetLastError());
    };
    for (int i = 0; i < kCopies; ++i) launch(i);
    const double ms = lockstep::bench::event_ms(stream, [&] {
      for (int i = 0; i < 5 * kCopies; ++i) launch(i);
    });
    const double gbs = static_cast<double>(kMatrixBytes) * 5 * kCopies / (ms * 1e6);
    std::printf("  %5.0f %5.1f%%", gbs, 100.0 * gbs / copy);
  }
  std::printf("\n");
}

}  // namespace

int main() {
  cudaStream_t stream;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int device = 0, sms = 0;
  LS_CHECK_CUDA(cudaGetDevice(&device));
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::vector<unsigned char*> copies(kCopies);
  for (auto& c : copies) {
    LS_CHECK_CUDA(cudaMalloc(&c, kMatrixBytes));
    LS_CHECK_CUDA(cudaMemsetAsync(c, 0x3c, kMatrixBytes, stream));
  }
  unsigned* sink = nullptr;
  LS_CHECK_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  const double copy = lockstep::bench::copy_gbs(stream);
  std::printf("copy bandwidth %.0f GB/s; rounds of 8 KB a warp; GB/s and %% of copy at 4, 8, 12, 16, 32 warps an SM\n",
              copy);
  measure<1, 8192, true>(copies, sink, stream, sms, copy);
  measure<2, 4096, true>(copies, sink, stream, sms, copy);
  measure<4, 2048, true>(copies, sink, stream, sms, copy);
  measure<8, 1024, true>(copies, sink, stream, sms, copy);
  measure<16, 512, true>(copies, sink, stream, sms, copy);
  measure<32, 256, true>(copies, sink, stream, sms, copy);
  measure<64, 128, true>(copies, sink, stream, sms, copy);
  measure<16, 512, false>(copies, sink, stream, sms, copy);
  measure<32, 256, false>(copies, sink, stream, sms, copy);
  measure<64, 128, false>(copies, sink, stream, sms, copy);
  for (auto* c : copies) cudaFree(c);
  cudaFree(sink);
  return 0;
}
