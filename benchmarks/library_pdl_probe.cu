// Experiment (thirtieth session): do cuBLASLt's kernels wait for a
// programmatic predecessor? cuBLASLt launches its kernels as ordinary ones;
// an edited graph can make a product the programmatic dependent of the
// kernel before it (cudaGraphEdgeData, cudaGraphKernelNodePortProgrammatic),
// which is safe only if the product waits (griddepcontrol.wait) before it
// reads its input. Here a writer kernel of ours lets its dependents launch at
// once and writes x only 0.2 ms later (x is zero before); the product reads x.
// A product that waits always matches its eager result. The writer's grid
// matters: with a block on every SM the product's blocks may find no room to
// start early, and even a product that does not wait then computes right
// (that hid the answer from the first run of this experiment).
// On an H100 with cuBLASLt 13.0, 2026-12-06: every product whose first node
// is a library kernel was wrong 5 times in 5 behind an 8-block writer, and
// none behind a 132-block one. cuBLASLt's kernels do not wait.
// Run: build/library_pdl_probe [trials] [writer blocks,...]
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/cuda_bench_support.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/linear.h"

namespace {

using lockstep::DType;
namespace cuda = lockstep::cuda;

__global__ void late_write(__nv_bfloat16* x, int64_t n, long long spin_ns) {
  cuda::start_after_producers();  // lets the dependents launch at once
  long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  while (now - start < spin_ns);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __float2bfloat16(static_cast<float>((static_cast<uint32_t>(i) * 2654435761u >> 8) % 2001) / 1000.0f - 1.0f);
}

std::string kernel_name(cudaGraphNode_t node) {
  using GetParams = CUresult (*)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS*);
  using FuncName = CUresult (*)(const char**, CUfunction);
  static GetParams get_params = nullptr;
  static FuncName func_name = nullptr;
  if (get_params == nullptr) {
    cudaDriverEntryPointQueryResult found{};
    LS_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuGraphKernelNodeGetParams", reinterpret_cast<void**>(&get_params),
                                                   12030, cudaEnableDefault, &found));
    LS_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuFuncGetName", reinterpret_cast<void**>(&func_name), 12030,
                                                   cudaEnableDefault, &found));
  }
  CUDA_KERNEL_NODE_PARAMS p{};
  const char* name = nullptr;
  if (get_params(reinterpret_cast<CUgraphNode>(node), &p) != CUDA_SUCCESS || p.func == nullptr ||
      func_name(&name, p.func) != CUDA_SUCCESS || name == nullptr)
    return "?";
  return name;
}

// Makes the edges from the graph's root (the writer) into kernel nodes
// programmatic; returns the first such kernel's name.
std::string make_root_edges_programmatic(cudaGraph_t g) {
  cudaGraphNode_t root = nullptr;
  size_t roots = 1, count = 0;
  LS_CHECK_CUDA(cudaGraphGetRootNodes(g, &root, &roots));
  LS_CHECK_CUDA(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  LS_CHECK_CUDA(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &count));
  std::string name = "(none)";
  for (size_t i = 0; i < count; ++i) {
    cudaGraphNodeType type{};
    LS_CHECK_CUDA(cudaGraphNodeGetType(to[i], &type));
    if (from[i] != root || type != cudaGraphNodeTypeKernel) continue;
    cudaGraphEdgeData programmatic{};
    programmatic.from_port = cudaGraphKernelNodePortProgrammatic;
    programmatic.type = cudaGraphDependencyTypeProgrammatic;
    LS_CHECK_CUDA(cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1));
    LS_CHECK_CUDA(cudaGraphAddDependencies(g, &from[i], &to[i], &programmatic, 1));
    name = kernel_name(to[i]);
  }
  return name;
}

std::vector<uint16_t> download(const void* p, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  LS_CHECK_CUDA(cudaMemcpy(h.data(), p, h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

struct Shape {
  const char* name;
  int64_t in, out;
  bool residual;
};

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 5;
  std::vector<unsigned> grids;
  std::stringstream list(argc > 2 ? argv[2] : "8,132");
  for (std::string g; std::getline(list, g, ',');) grids.push_back(static_cast<unsigned>(std::stoul(g)));
  cudaStream_t s;
  LS_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cuda::LinearContext ctx;
  const Shape shapes[] = {{"qkv", 4096, 6144, false},      {"o_proj+res", 4096, 4096, true},
                          {"gate_up", 4096, 28672, false}, {"down+res", 14336, 4096, true},
                          {"lm_head", 4096, 128256, false}, {"small", 1024, 1536, false}};
  std::printf("%-11s %4s %7s %8s  %s\n", "shape", "rows", "writer", "wrong", "first library kernel");
  for (const Shape& sh : shapes) {
    __nv_bfloat16 *w, *res;
    LS_CHECK_CUDA(cudaMalloc(&w, sh.out * sh.in * 2));
    LS_CHECK_CUDA(cudaMalloc(&res, 64 * sh.out * 2));
    lockstep::bench::fill_random<<<264, 256, 0, s>>>(w, sh.out * sh.in, 1u, 0.05f);
    lockstep::bench::fill_random<<<264, 256, 0, s>>>(res, 64 * sh.out, 2u, 1.0f);
    for (int64_t rows : {3, 8, 19, 32, 64}) {
      __nv_bfloat16 *x, *y;
      LS_CHECK_CUDA(cudaMalloc(&x, rows * sh.in * 2));
      LS_CHECK_CUDA(cudaMalloc(&y, rows * sh.out * 2));
      lockstep::LinearParams p{.x = x, .weight = w, .y = y, .rows = rows, .in_features = sh.in,
                               .out_features = sh.out, .act_dtype = DType::kBF16, .weight_dtype = DType::kBF16,
                               .residual = sh.residual ? res : nullptr};
      LS_LAUNCH("late_write", late_write, dim3(132), dim3(256), 0, s, x, rows * sh.in, 0ll);
      cuda::linear(p, ctx, s);
      LS_CHECK_CUDA(cudaStreamSynchronize(s));
      const auto want = download(y, rows * sh.out);
      for (unsigned blocks : grids) {
        cudaGraph_t g;
        LS_CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
        LS_LAUNCH("late_write", late_write, dim3(blocks), dim3(256), 0, s, x, rows * sh.in, 200000ll);
        cuda::linear(p, ctx, s);
        LS_CHECK_CUDA(cudaStreamEndCapture(s, &g));
        const std::string name = make_root_edges_programmatic(g);
        cudaGraphExec_t e;
        LS_CHECK_CUDA(cudaGraphInstantiate(&e, g, 0));
        int wrong = 0;
        for (int t = 0; t < trials; ++t) {
          LS_CHECK_CUDA(cudaMemsetAsync(x, 0, rows * sh.in * 2, s));
          LS_CHECK_CUDA(cudaGraphLaunch(e, s));
          LS_CHECK_CUDA(cudaStreamSynchronize(s));
          wrong += download(y, rows * sh.out) != want;
        }
        cudaGraphExecDestroy(e);
        cudaGraphDestroy(g);
        std::printf("%-11s %4lld %7u %5d/%-2d  %s\n", sh.name, static_cast<long long>(rows), blocks, wrong, trials,
                    name.c_str());
      }
      cudaFree(x);
      cudaFree(y);
    }
    cudaFree(w);
    cudaFree(res);
  }
  return 0;
}
