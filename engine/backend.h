// Where the ops run. The runner calls ops through this interface only, so the
// CPU reference and the CUDA backend share one layer sequence. Each op takes
// the same parameter struct on every backend (kernels/<op>.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/error.h"
#include "kernels/argmax.h"
#include "kernels/attention.h"
#include "kernels/embedding.h"
#include "kernels/linear.h"
#include "kernels/next_tokens.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/silu_mul.h"

namespace lockstep {

// Memory owned by a backend (host memory for the CPU backend, device memory
// for CUDA). Moves, never copies.
class Buffer {
 public:
  Buffer() = default;
  Buffer(void* data, int64_t bytes, std::function<void(void*)> release)
      : data_(data, std::move(release)), bytes_(bytes) {}
  void* data() const { return data_.get(); }
  template <typename T>
  T* as() const { return static_cast<T*>(data_.get()); }
  int64_t bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

 private:
  std::unique_ptr<void, std::function<void(void*)>> data_{nullptr, [](void*) {}};
  int64_t bytes_ = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual DType act_dtype() const = 0;     // activations and KV cache
  virtual DType weight_dtype() const = 0;  // weights as stored on the backend

  virtual Buffer alloc(int64_t bytes) = 0;
  // Memory for weights: written once as they load, then read whole every
  // step (the CPU backend puts it on huge pages; the KV cache, filled a
  // position at a time, stays on alloc's small pages).
  virtual Buffer alloc_weights(int64_t bytes) { return alloc(bytes); }
  // Whether alloc() returns host memory the host may write directly (the
  // CPU), so that loading fills it in place rather than through to_backend.
  virtual bool host_memory() const { return false; }
  // The KV cache layout the backend's attention reads fastest
  // (KvCacheShape::head_major): head-major on the CPU.
  virtual bool kv_cache_head_major() const { return false; }
  // Whether the layer's two RMSNorm weights are folded into W_qkv and
  // W_gate_up at load, so that the layer runs no norm kernels (Runner). The
  // CPU backend keeps 16-bit weights and float32 arithmetic, where the fold's
  // rounding of W·g would be the largest error left; the GPU's bf16 path
  // rounds as much elsewhere.
  virtual bool folds_input_norms() const { return false; }
  virtual void to_backend(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual void to_host(void* host_dst, const void* src, int64_t bytes) = 0;
  // Copies bytes between this backend's memory, queued like the ops.
  virtual void copy_within(void* dst, const void* src, int64_t bytes) = 0;
  // Converts float32 host values to `dtype` and places them on the backend.
  Buffer upload(const std::vector<float>& host, DType dtype);
  // Memory the backend's ops write and the host reads directly, once the op
  // is done (wait_event): pinned, mapped memory on CUDA. Zeroed.
  virtual Buffer alloc_host_visible(int64_t bytes) = 0;
  // Waits for all queued work (a no-op on the CPU).
  virtual void synchronize() = 0;
  // Marks the queue's current end as event k (k < kEvents); wait_event(k)
  // returns once the work queued before that mark is done (no-ops on the CPU,
  // whose ops run as they are called).
  static constexpr int kEvents = 2;
  virtual void record_event(int /*k*/) {}
  virtual void wait_event(int /*k*/) {}

  virtual void embedding(const EmbeddingParams& p) = 0;
  virtual void linear(const LinearParams& p) = 0;
  virtual void attention(const AttentionParams& p) = 0;
  virtual void argmax(const ArgmaxParams& p) = 0;
  virtual void sample(const SampleParams& p) = 0;
  virtual void next_tokens(const NextTokensParams& p) = 0;

  // Graphs (CUDA graphs): the ops queued between capture_begin() and
  // capture_end(id) are recorded, not run, as graph `id` (replacing an older
  // one); replay(id) queues them again. Asked for only when
  // supports_graphs() is true.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_begin() { LS_FAIL(ErrorKind::kInternal, "backend {} has no graphs", name()); }
  virtual void capture_end(int64_t /*id*/) { LS_FAIL(ErrorKind::kInternal, "backend {} has no graphs", name()); }
  virtual void replay(int64_t /*id*/) { LS_FAIL(ErrorKind::kInternal, "backend {} has no graphs", name()); }

  // The stream the backend queues work on (cudaStream_t on CUDA; null on
  // the CPU): device transports enqueue their collectives on it.
  virtual void* stream_handle() const { return nullptr; }
  // The device index this backend runs on (-1: the CPU).
  virtual int device() const { return -1; }
  // Bytes the KV cache may take when --kv-cache-bytes is not given, asked
  // once the weights are in memory, for each of the `sharing` ranks whose
  // buffers share this memory: on the CPU a quarter of the host's memory,
  // at most what is then available (free_memory_bytes);
  // on a GPU its free memory less a tenth of the total (activations,
  // workspaces, graphs, NCCL's buffers).
  virtual int64_t default_kv_cache_bytes(int sharing) const;
  // Bytes this rank's buffers could take now: on a GPU its free memory; on
  // the CPU the host's available memory (MemAvailable: free pages and page
  // cache that can be dropped), capped by the process's cgroup limit.
  virtual int64_t free_memory_bytes() const;
  // Fails, naming the value, when this backend's attention cannot take
  // head_dim (checked before the weights load).
  virtual void require_attention_head_dim(int64_t /*head_dim*/) const {}

  // For `bench`: the bandwidth of a copy within this backend's memory,
  // bytes read plus written per second in GB/s (the median of ten copies
  // between two buffers of `bytes`, after two warm-up copies; on the CPU
  // with the ops' threads), and the memory in use where it runs: the GPU's
  // (all processes on it) on CUDA, this process's resident set on the CPU.
  virtual double copy_bandwidth_gbs(int64_t bytes) = 0;
  virtual int64_t memory_used_bytes() const = 0;

  // Named ranges for profilers (NVTX on CUDA); no-ops elsewhere.
  virtual void range_push(const char* /*name*/) {}
  virtual void range_pop() {}
};

// weights: the dtype the products' weights are kept in (float32, or a 16-bit
// type, widened as they are read); activations are float32 either way.
std::unique_ptr<Backend> make_cpu_backend(DType weights = DType::kF32);

#if LOCKSTEP_WITH_CUDA
// GPUs visible to this process (0 when the driver finds none).
int cuda_device_count();
// The CUDA backend on GPU `local_rank % cuda_device_count()`, computing in
// `dtype` (activations, KV cache and weights alike): bf16, f16 or float32.
// overlap_launches: kernels may start while the previous one finishes
// (programmatic dependent launch; a process-wide setting).
std::unique_ptr<Backend> make_cuda_backend(int device, DType dtype, bool overlap_launches = true);
#endif

}  // namespace lockstep
