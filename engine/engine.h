// Assembles one rank's engine from a model folder: config, shard plan,
// checkpoint, backend, weights, runner and the tensor-parallel group.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/config.h"
#include "engine/io/safetensors.h"
#include "engine/runner.h"
#include "engine/weights.h"
#include "tp/communicator.h"
#include "tp/group.h"
#include "tp/sharding.h"

namespace lockstep {

struct EngineOptions {
  std::filesystem::path model_dir;
  // Instead of model_dir: the make-model preset (with preset_arch) whose
  // random bf16 weights are generated in memory as they load (bench).
  std::string preset;
  std::string preset_arch = "llama";
  std::string backend = "cpu";   // cpu or cuda (see default_backend())
  std::string dtype = "auto";    // auto: float32 on the CPU; the checkpoint's 16-bit type on CUDA (f32 -> bf16)
  int local_rank = 0;            // picks the GPU: devices[local_rank % n], or local_rank % visible GPUs
  int local_ranks = 1;           // ranks on this host (with fewer GPUs than ranks, --comm auto avoids NCCL)
  std::vector<int> devices;      // --devices: the GPU of each local rank (empty: local_rank % visible)
  // The tensor-parallel transport: auto (one rank: none; several: mpi on the
  // CPU, nccl on CUDA), single, mpi (on CUDA: device buffers staged through the
  // host, so ranks may share a GPU) or nccl (CUDA only; at TP=1 too).
  std::string comm = "auto";
  double collective_timeout_s = 60.0;
  int64_t max_seq_len = 0;       // 0: the model's max_positions(), capped by kv_cache_bytes
  std::string max_seq_len_origin = "--max-seq-len";  // what set max_seq_len, for its errors
  int64_t max_batch = 1;         // sequences at once
  // Tokens per forward step; longer prompts are chunked. 0: step_tokens()'s default.
  int64_t max_step_tokens = 0;
  int64_t kv_cache_bytes = 0;    // 0: Backend::default_kv_cache_bytes (host memory on the CPU, free GPU memory on CUDA)
  static constexpr int kMaxThreads = 1024;
  static constexpr int64_t kMaxBatch = int64_t{1} << 16;
  static constexpr int64_t kMaxStepTokens = int64_t{1} << 20;
  int threads = 0;               // host threads per rank: CPU ops, weight loading (0: this host's cores / its ranks)
  bool eager = false;            // no graphs: launch every op of every step
  bool no_pdl = false;           // CUDA: no launch overlap (programmatic dependent launch)
  bool sync_steps = false;       // generate: no decode step queued before the last one's tokens are in (Generator)
  Diagnostics diag;
  void validate() const;
  // The step token limit: max_step_tokens, else 2048 on CUDA (a prompt's
  // products over many rows run nearer the GPU's peak, and each chunk reads
  // every weight once) and 256 on the CPU (whose prefill speed does not
  // depend on it, and whose long steps would hold decoding sequences back).
  int64_t step_tokens() const;
  std::string summary() const;
  std::string model_name() const;  // the folder, or "preset NAME (ARCH)"
};

class Engine {
 public:
  // Every check that does not need data (config, TP divisibility, shapes,
  // context length) runs on every rank before the first collective.
  // `world` is the host transport of the job (MPI, or single-rank); the
  // engine picks the tensor-parallel transport from it and the backend.
  Engine(const EngineOptions& options, Communicator& world);

  const ModelConfig& config() const { return config_; }
  const ShardPlan& plan() const { return plan_; }
  const LoadStats& load_stats() const { return load_stats_; }
  TpGroup& group() { return *group_; }
  double load_seconds() const { return load_seconds_; }
  Backend& backend() { return *backend_; }

 private:
  ModelConfig config_;
  ShardPlan plan_;
  std::unique_ptr<TensorStore> store_;
  // Declared before the backend, so destroyed after it: NCCL (2.26 and
  // later) will not destroy a communicator while CUDA graphs that captured
  // its collectives (the backend's) still exist, and would wait forever.
  std::unique_ptr<Communicator> owned_comm_;  // a device transport made for the backend
  std::unique_ptr<Backend> backend_;
  Communicator* comm_ = nullptr;              // the tensor-parallel transport in use
  LoadStats load_stats_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<TpGroup> group_;
  double load_seconds_ = 0.0;
};

// "cuda" when this build has CUDA and a GPU is visible, else "cpu".
std::string default_backend();

// Resolves the KV-cache length: the requested one (refused when it exceeds
// the budget or the model's positions) or the model's, capped by the budget.
int64_t resolve_max_seq_len(const ModelConfig& config, const ShardPlan& plan, const EngineOptions& options,
                            size_t act_bytes, int64_t default_budget);

}  // namespace lockstep
