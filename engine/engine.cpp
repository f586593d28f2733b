#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/model_writer.h"
#include "kernels/cpu_threads.h"
#if LOCKSTEP_WITH_CUDA
#include "tp/cuda/nccl_communicator.h"
#endif

namespace lockstep {

void EngineOptions::validate() const {
  LS_REQUIRE(!model_dir.empty() || !preset.empty(), ErrorKind::kInvalidArgument, "--model is required");
  LS_REQUIRE(model_dir.empty() || preset.empty(), ErrorKind::kInvalidArgument,
             "--model and --preset exclude each other");
#if LOCKSTEP_WITH_CUDA
  LS_REQUIRE(backend == "cpu" || backend == "cuda", ErrorKind::kInvalidArgument,
             "unknown backend '{}' (this build has: cpu, cuda)", backend);
#else
  LS_REQUIRE(backend == "cpu", ErrorKind::kInvalidArgument, "unknown backend '{}' (this build has: cpu)", backend);
#endif
  if (dtype != "auto") parse_dtype_name(dtype);
  LS_REQUIRE(comm == "auto" || comm == "single" || comm == "mpi" || comm == "nccl", ErrorKind::kInvalidArgument,
             "unknown --comm '{}' (auto, single, mpi, nccl)", comm);
  for (int d : devices) LS_REQUIRE(d >= 0, ErrorKind::kInvalidArgument, "--devices: bad device index {}", d);
  LS_REQUIRE(devices.empty() || backend != "cpu", ErrorKind::kInvalidArgument,
             "--devices picks GPUs, but the backend is cpu");
  LS_REQUIRE(collective_timeout_s > 0, ErrorKind::kInvalidArgument, "--collective-timeout must be positive");
  LS_REQUIRE(threads >= 0, ErrorKind::kInvalidArgument, "--threads must be >= 0 (0: automatic), got {}", threads);
  LS_REQUIRE(threads <= kMaxThreads, ErrorKind::kInvalidArgument, "--threads {} is above the limit of {}", threads,
             kMaxThreads);
  LS_REQUIRE(max_seq_len >= 0, ErrorKind::kInvalidArgument, "--max-seq-len must be >= 0, got {}", max_seq_len);
  LS_REQUIRE(max_seq_len <= INT32_MAX, ErrorKind::kInvalidArgument, "--max-seq-len {} is above the limit of {}",
             max_seq_len, INT32_MAX);
  LS_REQUIRE(max_batch >= 1, ErrorKind::kInvalidArgument, "--max-batch must be >= 1, got {}", max_batch);
  // Bounds far above any real use that keep the buffer sizes they multiply within 64 bits.
  LS_REQUIRE(max_batch <= kMaxBatch, ErrorKind::kInvalidArgument, "--max-batch {} is above the limit of {}", max_batch,
             kMaxBatch);
  LS_REQUIRE(max_step_tokens <= kMaxStepTokens, ErrorKind::kInvalidArgument,
             "--max-step-tokens {} is above the limit of {}", max_step_tokens, kMaxStepTokens);
  LS_REQUIRE(max_step_tokens >= 0, ErrorKind::kInvalidArgument, "--max-step-tokens must be >= 0, got {}",
             max_step_tokens);
  LS_REQUIRE(kv_cache_bytes >= 0, ErrorKind::kInvalidArgument, "KV cache budget must be >= 0");
}

int64_t EngineOptions::step_tokens() const {
  if (max_step_tokens > 0) return max_step_tokens;
  return backend == "cuda" ? 2048 : 256;
}

std::string EngineOptions::summary() const {
  return fmt::format("model={} backend={} dtype={} eager={} pdl={} sync_steps={} max_seq_len={} max_batch={} max_step_tokens={} kv_cache_bytes={} threads={}",
                     model_name(), backend, dtype, eager, !no_pdl, sync_steps, max_seq_len == 0 ? std::string("auto") : std::to_string(max_seq_len),
                     max_batch, max_step_tokens == 0 ? fmt::format("auto ({})", step_tokens()) : std::to_string(max_step_tokens),
                     kv_cache_bytes == 0 ? std::string("auto") : std::to_string(kv_cache_bytes),
                     threads == 0 ? std::string("auto") : std::to_string(threads));
}

std::string EngineOptions::model_name() const {
  return preset.empty() ? model_dir.string() : fmt::format("preset {} ({})", preset, preset_arch);
}

std::string default_backend() {
#if LOCKSTEP_WITH_CUDA
  if (cuda_device_count() > 0) return "cuda";
#endif
  return "cpu";
}

namespace {

std::unique_ptr<Backend> make_backend(const EngineOptions& o, const TensorStore& store) {
  // The host threads of this rank: the CPU backend's ops and, on every
  // backend, the conversion of the weights as they load.
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::set_threads(o.threads > 0 ? o.threads : std::max(1, cores / std::max(1, o.local_ranks)));
  spdlog::info("{} host thread(s)", cpu::threads());
  const DType checkpoint = store.info("model.embed_tokens.weight").dtype;
  if (o.backend == "cpu") {
    LS_REQUIRE(o.dtype == "auto" || parse_dtype_name(o.dtype) == DType::kF32, ErrorKind::kInvalidArgument,
               "the cpu backend computes in float32; --dtype {} needs --backend cuda", o.dtype);
    // The product weights of a checkpoint all in one 16-bit type stay in it:
    // the same values at half the memory and half the bytes a step.
    const std::vector<std::string> names = store.names();
    const bool uniform = std::all_of(names.begin(), names.end(),
                                     [&](const std::string& n) { return store.info(n).dtype == checkpoint; });
    const DType weights = uniform ? checkpoint : DType::kF32;
    spdlog::info("cpu backend: float32 arithmetic, {} product weights", dtype_name(weights));
    return make_cpu_backend(weights);
  }
  // validate() admits "cuda" only in builds with CUDA.
  DType dtype = DType::kBF16;
  if (o.dtype != "auto")
    dtype = parse_dtype_name(o.dtype);
  else if (checkpoint == DType::kF16)
    dtype = DType::kF16;
#if LOCKSTEP_WITH_CUDA
  const int gpus = cuda_device_count();
  LS_REQUIRE(gpus > 0, ErrorKind::kInvalidArgument, "--backend cuda: this host has no usable GPU (try --backend cpu)");
  const int device =
      o.devices.empty() ? o.local_rank % gpus : o.devices[static_cast<size_t>(o.local_rank) % o.devices.size()];
  LS_REQUIRE(device < gpus, ErrorKind::kInvalidArgument, "--devices: GPU {} does not exist (this host has {})", device,
             gpus);
  return make_cuda_backend(device, dtype, !o.no_pdl);
#else
  LS_FAIL(ErrorKind::kInvalidArgument, "unknown backend '{}' for {}", o.backend, dtype_name(dtype));
#endif
}

}  // namespace

int64_t resolve_max_seq_len(const ModelConfig& c, const ShardPlan& p, const EngineOptions& o, size_t act_bytes,
                            int64_t default_budget) {
  const int64_t budget = o.kv_cache_bytes > 0 ? o.kv_cache_bytes : default_budget;
  const int64_t slots = o.max_batch + (o.max_batch > 1 ? 1 : 0);  // + the runner's padding slot
  const int64_t per_position = 2 * c.num_layers * slots * p.kv_heads_local * c.head_dim *
                               static_cast<int64_t>(act_bytes);
  const int64_t fits = std::max<int64_t>(budget / per_position, 0);
  const int64_t limit = c.max_positions();
  const std::string limit_name = fmt::format("max_position_embeddings {}", limit);
  if (o.max_seq_len > 0) {
    LS_REQUIRE(o.max_seq_len <= limit, ErrorKind::kInvalidArgument, "{} {} exceeds the model's {}",
               o.max_seq_len_origin, o.max_seq_len, limit_name);
    LS_REQUIRE(o.max_seq_len <= fits, ErrorKind::kInvalidArgument,
               "{} {} for a batch of {} sequences needs {} bytes of KV cache per rank, over the budget of {} bytes",
               o.max_seq_len_origin, o.max_seq_len, o.max_batch, o.max_seq_len * per_position, budget);
    return o.max_seq_len;
  }
  LS_REQUIRE(fits >= 1, ErrorKind::kInvalidArgument,
             "the KV cache budget of {} bytes holds no position for a batch of {} sequences", budget, o.max_batch);
  if (fits < limit)
    spdlog::warn("KV cache capped at {} positions (the model's {}): budget {} bytes", fits, limit_name, budget);
  return std::min(fits, limit);
}

// The GPUs this host's ranks spread over: --devices' distinct entries, or
// every visible one (0 off CUDA).
int host_gpus(const EngineOptions& o) {
#if LOCKSTEP_WITH_CUDA
  const int visible = cuda_device_count();
#else
  const int visible = 0;
#endif
  return o.devices.empty() ? visible : static_cast<int>(std::set<int>(o.devices.begin(), o.devices.end()).size());
}

// The ranks whose buffers share this rank's backend memory: all of the
// host's on the CPU, those placed on the same GPU on CUDA.
int ranks_sharing_memory(const EngineOptions& o, const Backend& backend) {
  if (backend.host_memory()) return std::max(1, o.local_ranks);
  const int gpus = std::max(1, host_gpus(o));
  return std::max(1, (o.local_ranks + gpus - 1) / gpus);
}

// Refuses, before anything is read, weights larger than the memory this
// rank may fill (a 70B model on one 80 GB GPU, or on a laptop's CPU), which
// would otherwise fail at an allocation minutes into the load, or meet the
// kernel's OOM killer. Ranks that share the memory each count on an equal
// part of what is free, measured before any of them allocates weights.
void require_weights_fit(const ModelConfig& c, const ShardPlan& p, const Backend& backend, int sharing,
                         Communicator& world) {
  const int64_t need = weight_bytes(c, p, backend.weight_dtype(), backend.act_dtype());
  const int64_t share = backend.free_memory_bytes() / std::max(1, sharing);
  world.barrier();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const std::string where = backend.device() >= 0 ? fmt::format("GPU {}", backend.device()) : "this host";
  LS_REQUIRE(need <= share, ErrorKind::kOutOfMemory,
             "this rank's share of the weights needs {:.2f} GiB ({}, {} rank(s)), but {} has {:.2f} GiB free{}{}",
             need / kGiB, dtype_name(backend.weight_dtype()), p.size, where, share / kGiB,
             sharing > 1 ? fmt::format(" for each of its {} ranks", sharing) : std::string(),
             backend.device() >= 0 ? " (more GPUs, a rank on each, split the weights further)" : "");
}

// The tensor-parallel transport for this backend (see EngineOptions::comm).
// Returns the world itself or a device transport owned by `owned`.
Communicator* choose_transport(const EngineOptions& o, Communicator& world, Backend& backend,
                               std::unique_ptr<Communicator>& owned) {
  const bool on_gpu = backend.stream_handle() != nullptr;
  // NCCL refuses two ranks on one GPU: with more ranks on this host than GPUs
  // to spread them over, auto takes MPI through host staging instead.
  const int gpus = host_gpus(o);
  const bool shared_gpus = on_gpu && o.local_ranks > gpus;
  std::string comm = o.comm;
  if (comm == "auto") {
    comm = world.size() == 1 ? "single" : on_gpu && !shared_gpus ? "nccl" : "mpi";
    if (shared_gpus && world.size() > 1)
      spdlog::warn("{} ranks share {} GPU(s) on this host: NCCL cannot serve them, using MPI with host staging",
                   o.local_ranks, gpus);
  }
  LS_REQUIRE(comm != "single" || world.size() == 1, ErrorKind::kInvalidArgument,
             "--comm single cannot serve {} ranks", world.size());
  LS_REQUIRE(comm != "nccl" || on_gpu, ErrorKind::kInvalidArgument, "--comm nccl needs --backend cuda");
  if (!on_gpu || comm == "single") return &world;
#if LOCKSTEP_WITH_CUDA
  auto stream = static_cast<cudaStream_t>(backend.stream_handle());
  if (comm == "nccl")
    owned = make_nccl_communicator(
        NcclOptions{.device = backend.device(), .stream = stream, .collective_timeout_s = o.collective_timeout_s});
  else
    owned = make_host_staged_communicator(
        world.size() == 1 ? make_single_rank_communicator() : make_mpi_communicator(o.collective_timeout_s), stream);
#endif
  return owned.get();
}

Engine::Engine(const EngineOptions& options, Communicator& world) {
  auto start = std::chrono::steady_clock::now();
  options.validate();
  if (options.preset.empty()) {
    config_ = load_model_config(options.model_dir);
    store_ = std::make_unique<TensorStore>(options.model_dir);
  } else {
    RandomModel m = random_model(model_preset(options.preset, parse_arch_short_name(options.preset_arch)),
                                 DType::kBF16, 0);
    config_ = m.config;
    store_ = std::make_unique<TensorStore>(std::move(m.tensors), "preset " + options.preset);
  }
  spdlog::info("model: {}", config_.summary());
  check_checkpoint_shapes(*store_, config_);
  if (world.rank() == 0) warn_unread_tensors(*store_, config_);  // once: each rank reads a copy of one checkpoint
  plan_ = ShardPlan::make(config_, world.rank(), world.size());
  spdlog::debug("shard plan: {}", plan_.summary());
  backend_ = make_backend(options, *store_);
  backend_->require_attention_head_dim(config_.head_dim);
  require_weights_fit(config_, plan_, *backend_, ranks_sharing_memory(options, *backend_), world);
  comm_ = choose_transport(options, world, *backend_, owned_comm_);
  Communicator& comm = *comm_;
  const size_t act_bytes = dtype_size(backend_->act_dtype());
  // A requested context length against the model's limit before loading,
  // then against the memory the weights left (the least over the ranks, so
  // that every rank sizes its cache alike).
  if (options.max_seq_len > 0)
    resolve_max_seq_len(config_, plan_, options, act_bytes, std::numeric_limits<int64_t>::max());
  ModelWeights weights = load_weights(*store_, config_, plan_, comm, *backend_, &load_stats_);
  // Ranks that share a GPU measure its free memory only once all of them
  // hold their weights: a rank that measured earlier would count a
  // neighbour's weights as free.
  world.barrier();
  const int64_t kv_budget =
      min_over_ranks(world, backend_->default_kv_cache_bytes(ranks_sharing_memory(options, *backend_)));
  RunnerLimits limits{.max_slots = options.max_batch,
                      .max_seq = resolve_max_seq_len(config_, plan_, options, act_bytes, kv_budget),
                      .max_step_tokens = std::max(options.step_tokens(), options.max_batch),  // a decode step of every slot
                      .max_logit_rows = std::max(options.max_batch, std::min<int64_t>(options.step_tokens(), 64))};
  // Host buffers: through the world's host transport, whatever the device transport.
  verify_same_on_all_ranks(world, load_stats_.replicated_checksum, "replicated weights checksum");
  spdlog::debug("read {} of {} sharded checkpoint bytes, {} replicated bytes", load_stats_.sharded_bytes_read,
                load_stats_.sharded_bytes_in_checkpoint, load_stats_.replicated_bytes_read);
  spdlog::debug("weights take {} bytes of backend memory", weights.bytes());
  runner_ = std::make_unique<Runner>(config_, plan_, std::move(weights), *backend_, limits, options.diag);
  // Graphs need capturable collectives (NCCL or none; MPI's are host calls)
  // and no per-layer synchronization for --diag timing/numerics.
  const bool graphs = !options.eager && backend_->supports_graphs() && comm.capturable() && !options.diag.timing &&
                      !options.diag.numerics;
  group_ = std::make_unique<TpGroup>(comm, *runner_, graphs);
  load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("loaded in {:.2f} s: backend {} ({}), {} rank(s) via {}, context {} positions, batch {}, {}",
               load_seconds_, backend_->name(), dtype_name(backend_->act_dtype()), comm.size(), comm.name(),
               limits.max_seq, limits.max_slots, graphs ? "graphs" : "eager");
}

}  // namespace lockstep
