// The CUDA backend: one GPU, one stream owned by the backend, every op from
// kernels/cuda. Activations, KV cache and weights share one dtype (the
// checkpoint's 16-bit type; float32 checkpoints run in bf16 unless float32
// is asked for). Copies to the host wait for the stream; copies from it do
// not need to (see to_backend).
#include <nvtx3/nvToolsExt.h>

#include <map>

#include "common/error.h"
#include "engine/backend.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/ops.h"

namespace lockstep {

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

namespace {

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, DType dtype) : device_(device), dtype_(dtype) {
    LS_CHECK_CUDA(cudaSetDevice(device_));
    process_identity().device = device_;
    LS_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LS_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_));
    linear_ = std::make_unique<cuda::LinearContext>();
    attention_workspace_ = alloc(cuda::attention_workspace_bytes(num_sms_));
    cuda::clear_attention_workspace(attention_workspace_.data(), num_sms_, stream_);
  }
  ~CudaBackend() override {
    for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
    attention_workspace_ = Buffer();
    linear_.reset();
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  void* stream_handle() const override { return stream_; }
  int device() const override { return device_; }
  DType act_dtype() const override { return dtype_; }
  DType weight_dtype() const override { return dtype_; }

  Buffer alloc(int64_t bytes) override {
    void* p = nullptr;
    LS_CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1)));
    return Buffer(p, bytes, [](void* q) { cudaFree(q); });
  }
  // No wait: from pageable memory (every host buffer here) the copy has
  // taken the source's bytes when the call returns, and the stream orders
  // the transfer before later work. A decode step's batch upload thus costs
  // no round trip before its graph launches.
  void to_backend(void* dst, const void* src, int64_t bytes) override {
    LS_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
  }
  void to_host(void* dst, const void* src, int64_t bytes) override {
    LS_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    synchronize();
  }
  void synchronize() override { LS_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

  void embedding(const EmbeddingParams& p) override { cuda::embedding(p, stream_); }
  void linear(const LinearParams& p) override { cuda::linear(p, *linear_, stream_); }
  void attention(const AttentionParams& p) override {
    AttentionParams q = p;
    q.workspace = attention_workspace_.data();
    q.workspace_bytes = attention_workspace_.bytes();
    cuda::attention(q, num_sms_, stream_);
  }
  void argmax(const ArgmaxParams& p) override { cuda::argmax(p, stream_); }
  void sample(const SampleParams& p) override { cuda::sample(p, stream_); }

  bool supports_graphs() const override { return true; }
  void capture_begin() override {
    // Relaxed: cuBLASLt may query the device while a plan is first made.
    LS_CHECK_CUDA(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  }
  void capture_end(int64_t id) override {
    cudaGraph_t graph = nullptr;
    LS_CHECK_CUDA(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    LS_CHECK_CUDA(status);
    auto [it, inserted] = graphs_.emplace(id, exec);
    if (!inserted) {
      cudaGraphExecDestroy(it->second);
      it->second = exec;
    }
  }
  void replay(int64_t id) override { LS_CHECK_CUDA(cudaGraphLaunch(graphs_.at(id), stream_)); }

  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }

 private:
  int device_;
  DType dtype_;
  cudaStream_t stream_ = nullptr;
  int num_sms_ = 0;
  std::unique_ptr<cuda::LinearContext> linear_;
  Buffer attention_workspace_;
  std::map<int64_t, cudaGraphExec_t> graphs_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, DType dtype, bool overlap_launches) {
  const int count = cuda_device_count();
  LS_REQUIRE(count > 0, ErrorKind::kCuda, "--backend cuda: no CUDA device is visible");
  LS_REQUIRE(device >= 0 && device < count, ErrorKind::kInvalidArgument, "device {} is not one of the {} visible GPUs",
             device, count);
  cuda::set_overlapped_launches(overlap_launches);
  return std::make_unique<CudaBackend>(device, dtype);
}

}  // namespace lockstep
