// The CUDA backend: one GPU, one stream owned by the backend, every op from
// kernels/cuda. Activations, KV cache and weights share one dtype (the
// checkpoint's 16-bit type; float32 checkpoints run in bf16 unless float32
// is asked for). Copies to the host wait for the stream; copies from it do
// not (see to_backend).
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <vector>

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
    LS_CHECK_CUDA(cudaMallocHost(&upload_staging_, kStagingBytes));
    LS_CHECK_CUDA(cudaMallocHost(&download_staging_, kStagingBytes));
    LS_CHECK_CUDA(cudaEventCreateWithFlags(&upload_done_, cudaEventDisableTiming));
    for (cudaEvent_t& e : events_) LS_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    linear_ = std::make_unique<cuda::LinearContext>();
    attention_workspace_ = alloc(cuda::attention_workspace_bytes(num_sms_));
    cuda::clear_attention_workspace(attention_workspace_.data(), num_sms_, stream_);
  }
  ~CudaBackend() override {
    for (auto& [id, exec] : graphs_) cudaGraphExecDestroy(exec);
    attention_workspace_ = Buffer();
    linear_.reset();
    cudaEventDestroy(upload_done_);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    cudaFreeHost(upload_staging_);
    cudaFreeHost(download_staging_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda"; }
  void* stream_handle() const override { return stream_; }
  int device() const override { return device_; }
  int64_t default_kv_cache_bytes(int sharing) const override {
    size_t free_bytes = 0, total = 0;
    LS_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    const int64_t usable = std::max<int64_t>(static_cast<int64_t>(free_bytes) - static_cast<int64_t>(total / 10), 0);
    return usable / std::max(1, sharing);
  }
  int64_t free_memory_bytes() const override {
    size_t free_bytes = 0, total = 0;
    LS_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(free_bytes);
  }
  DType act_dtype() const override { return dtype_; }
  DType weight_dtype() const override { return dtype_; }
  bool folds_input_norms() const override { return true; }

  Buffer alloc(int64_t bytes) override {
    void* p = nullptr;
    LS_CHECK_CUDA(cudaMalloc(&p, static_cast<size_t>(bytes > 0 ? bytes : 1)));
    return Buffer(p, bytes, [](void* q) { cudaFree(q); });
  }
  // Small copies (a step's batch, its chosen ids) go through pinned staging
  // buffers, which the GPU reads and writes directly; pageable memory costs
  // the driver a bounce copy. The upload does not wait for its copy: the
  // stream orders it before later work, and its staging buffer is refilled
  // only once the copy is done (an event). Larger copies (weights) go from
  // pageable memory, whose bytes the driver has taken when the call returns.
  void to_backend(void* dst, const void* src, int64_t bytes) override {
    const auto n = static_cast<size_t>(bytes);
    if (bytes > kStagingBytes) {
      LS_CHECK_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_));
      return;
    }
    LS_CHECK_CUDA(cudaEventSynchronize(upload_done_));
    std::memcpy(upload_staging_, src, n);
    LS_CHECK_CUDA(cudaMemcpyAsync(dst, upload_staging_, n, cudaMemcpyHostToDevice, stream_));
    LS_CHECK_CUDA(cudaEventRecord(upload_done_, stream_));
  }
  void to_host(void* dst, const void* src, int64_t bytes) override {
    const auto n = static_cast<size_t>(bytes);
    const bool staged = bytes <= kStagingBytes;
    LS_CHECK_CUDA(cudaMemcpyAsync(staged ? download_staging_ : dst, src, n, cudaMemcpyDeviceToHost, stream_));
    synchronize();
    if (staged) std::memcpy(dst, download_staging_, n);
  }
  void copy_within(void* dst, const void* src, int64_t bytes) override {
    LS_CHECK_CUDA(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
  }
  // Pinned and mapped: with unified addressing the one pointer serves the
  // host and the kernels, which write through to host memory.
  Buffer alloc_host_visible(int64_t bytes) override {
    void* p = nullptr;
    const auto n = static_cast<size_t>(bytes > 0 ? bytes : 1);
    LS_CHECK_CUDA(cudaHostAlloc(&p, n, cudaHostAllocMapped));
    std::memset(p, 0, n);
    return Buffer(p, bytes, [](void* q) { cudaFreeHost(q); });
  }
  void synchronize() override { LS_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

  double copy_bandwidth_gbs(int64_t bytes) override {
    Buffer a = alloc(bytes), b = alloc(bytes);
    LS_CHECK_CUDA(cudaMemsetAsync(a.data(), 1, static_cast<size_t>(bytes), stream_));
    cudaEvent_t start = nullptr, stop = nullptr;
    LS_CHECK_CUDA(cudaEventCreate(&start));
    LS_CHECK_CUDA(cudaEventCreate(&stop));
    std::vector<float> ms(10);
    for (int i = -2; i < static_cast<int>(ms.size()); ++i) {
      LS_CHECK_CUDA(cudaEventRecord(start, stream_));
      copy_within(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), bytes);
      LS_CHECK_CUDA(cudaEventRecord(stop, stream_));
      LS_CHECK_CUDA(cudaEventSynchronize(stop));
      if (i >= 0) LS_CHECK_CUDA(cudaEventElapsedTime(&ms[static_cast<size_t>(i)], start, stop));
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
  }
  int64_t memory_used_bytes() const override {
    size_t free_bytes = 0, total = 0;
    LS_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(total - free_bytes);
  }
  void record_event(int k) override { LS_CHECK_CUDA(cudaEventRecord(events_.at(static_cast<size_t>(k)), stream_)); }
  void wait_event(int k) override { LS_CHECK_CUDA(cudaEventSynchronize(events_.at(static_cast<size_t>(k)))); }

  void embedding(const EmbeddingParams& p) override { cuda::embedding(p, stream_); }
  void linear(const LinearParams& p) override { cuda::linear(p, *linear_, stream_); }
  void require_attention_head_dim(int64_t head_dim) const override { cuda::require_attention_head_dim(head_dim); }
  void attention(const AttentionParams& p) override {
    AttentionParams q = p;
    q.workspace = attention_workspace_.data();
    q.workspace_bytes = attention_workspace_.bytes();
    cuda::attention(q, num_sms_, stream_);
  }
  void argmax(const ArgmaxParams& p) override { cuda::argmax(p, stream_); }
  void sample(const SampleParams& p) override { cuda::sample(p, stream_); }
  void next_tokens(const NextTokensParams& p) override { cuda::next_tokens(p, stream_); }

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
  static constexpr int64_t kStagingBytes = 64 << 10;
  cudaStream_t stream_ = nullptr;
  int num_sms_ = 0;
  void* upload_staging_ = nullptr;    // pinned, kStagingBytes
  void* download_staging_ = nullptr;  // pinned, kStagingBytes
  cudaEvent_t upload_done_ = nullptr;  // the last staged upload has been copied
  std::array<cudaEvent_t, kEvents> events_{};  // record_event / wait_event
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
