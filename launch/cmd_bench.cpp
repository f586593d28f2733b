// lockstep bench: decode and prefill speed of a model on this machine.
//
// Decode: for each batch size, that many sequences with a prompt of --ctx
// random tokens, then --steps greedy steps; the time per step is taken
// between the third and the last step (the first steps of a batch size run
// eagerly and capture its graph). Achieved bandwidth counts the bytes one
// rank must read in a step (its share of every weight once, in the dtype the
// backend keeps them in, and of each sequence's KV cache at the mean
// context) against a copy within the same memory measured in the same run
// (device to device on a GPU; host memory on the ops' threads on the CPU). With
// graphs, the last step's graph is also replayed back to back (the GPU's
// time per step alone) and with a wait after each replay.
// Prefill: one --prefill-token prompt, in one step unless --max-step-tokens
// chunks it, timed --prefill-runs times after one warm-up; the median is
// reported (one run of a 2048-token prompt on an H200 lasts ~50 ms, and
// single runs of the same binary spread by 5%: benchmarks/RESULTS.md).
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "kernels/cpu_threads.h"
#include "launch/commands.h"
#include "launch/world.h"

namespace lockstep::cli {

namespace {

struct BenchConfig {
  EngineOptions engine;
  std::string batches = "1,8,32,64";
  int64_t ctx = 1024;
  int64_t steps = 128;
  int64_t prefill = 2048;
  // Default 5 on a GPU, 1 on the CPU (a 2048-token prompt there takes minutes).
  std::optional<int64_t> prefill_runs;
  SamplingParams sampling;  // of every decode request (default greedy)
  std::string json;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Weights every step reads (matmuls and the LM head), in bytes, all ranks together.
double weight_bytes(const ModelConfig& c, size_t elem) {
  const double layer = static_cast<double>(c.hidden_size) * (c.qkv_dim() + c.q_dim() + 3.0 * c.intermediate_size);
  return (static_cast<double>(c.num_layers) * layer + static_cast<double>(c.vocab_size) * c.hidden_size) *
         static_cast<double>(elem);
}

// Bytes one rank reads in a decode step: its shares of the weights (of
// `weight_elem` bytes each) and of the KV cache (`positions` cached
// positions over the batch, of `cache_elem` bytes).
double rank_step_bytes(const ModelConfig& c, const ShardPlan& p, size_t weight_elem, size_t cache_elem,
                       double positions) {
  const double hd = static_cast<double>(c.head_dim);
  const double q = static_cast<double>(p.q_heads_local) * hd, kv = static_cast<double>(p.kv_heads_local) * hd;
  const double layer = static_cast<double>(c.hidden_size) * (q + 2.0 * kv + q + 3.0 * static_cast<double>(p.inter_local));
  const double weights = static_cast<double>(c.num_layers) * layer + static_cast<double>(p.vocab_local) * c.hidden_size;
  const double cache = positions * 2.0 * static_cast<double>(c.num_layers) * kv;
  return weights * static_cast<double>(weight_elem) + cache * static_cast<double>(cache_elem);
}

std::vector<int32_t> random_prompt(int64_t n, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(1, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (auto& t : p) t = pick(rng);
  return p;
}

// The collectives of one decode step on their own: the embedding's and two
// per layer's all-reduces of [batch, hidden] through the engine's transport,
// captured in one graph as the step's are (eager when the steps are), run
// 20 times, then one backend synchronization.
double collective_ms_per_step(Engine& engine, int64_t batch, bool graphs) {
  Communicator& comm = engine.group().comm();
  if (comm.size() == 1) return 0.0;
  Backend& be = engine.backend();
  const int64_t count = batch * engine.config().hidden_size;
  Buffer buf = be.alloc(count * static_cast<int64_t>(dtype_size(be.act_dtype())));
  be.to_backend(buf.data(), std::vector<uint8_t>(static_cast<size_t>(buf.bytes()), 0).data(), buf.bytes());
  const int64_t per_step = 1 + 2 * engine.config().num_layers;
  auto enqueue_step = [&] {
    for (int64_t i = 0; i < per_step; ++i) comm.all_reduce_sum(buf.data(), count, be.act_dtype());
  };
  constexpr int64_t kGraph = -1;  // apart from the steps' graphs (keys >= 0)
  const bool graphed = graphs && be.supports_graphs() && comm.capturable();
  if (graphed) {
    be.capture_begin();
    enqueue_step();
    be.capture_end(kGraph);
  }
  auto run = [&](int steps) {
    for (int i = 0; i < steps; ++i) graphed ? be.replay(kGraph) : enqueue_step();
    be.synchronize();
  };
  run(2);  // warm-up
  constexpr int kSteps = 20;
  const auto start = Clock::now();
  run(kSteps);
  return seconds_since(start) * 1e3 / kSteps;
}

// The last decode step's graph replayed back to back (the GPU's time per
// step without the host's work between steps), with a wait for each
// (adding the launch and wake-up latency a step pays), and one step ahead
// with an event per step, as queued decode steps run (Generator): 0 without
// graphs.
struct GraphTimes {
  double back_to_back = 0.0, synced = 0.0, queued = 0.0;
};

GraphTimes graph_ms_per_step(Engine& engine) {
  constexpr int kReplays = 20;
  Backend& be = engine.backend();
  TpGroup& group = engine.group();
  be.synchronize();
  auto start = Clock::now();
  if (!group.replay_captured(kReplays)) return {};
  be.synchronize();
  GraphTimes t{.back_to_back = seconds_since(start) * 1e3 / kReplays};
  start = Clock::now();
  for (int i = 0; i < kReplays; ++i) {
    group.replay_captured(1);
    be.synchronize();
  }
  t.synced = seconds_since(start) * 1e3 / kReplays;
  start = Clock::now();
  for (int i = 0; i < kReplays; ++i) {
    group.replay_captured(1);
    be.record_event(i % Backend::kEvents);
    if (i > 0) be.wait_event((i - 1) % Backend::kEvents);
  }
  be.synchronize();
  t.queued = seconds_since(start) * 1e3 / kReplays;
  return t;
}

nlohmann::json bench_decode(Engine& engine, int64_t batch, const BenchConfig& b, double copy_gbs, std::mt19937& rng) {
  const ModelConfig& c = engine.config();
  std::vector<GenerationRequest> requests(static_cast<size_t>(batch));
  for (auto& r : requests)
    r = GenerationRequest{
        .prompt = random_prompt(b.ctx, c.vocab_size, rng), .max_new_tokens = b.steps, .sampling = b.sampling};
  std::vector<Clock::time_point> step_done;  // when sequence 0 got each token
  Generator gen(engine.group(), !b.engine.sync_steps);
  gen.generate(requests, false, [&](size_t seq, int32_t) {
    if (seq + 1 == static_cast<size_t>(batch)) step_done.push_back(Clock::now());
  });
  LS_REQUIRE(static_cast<int64_t>(step_done.size()) == b.steps && b.steps > 4, ErrorKind::kInvalidArgument,
             "bench needs --steps > 4 and every sequence to run them");
  const double secs = std::chrono::duration<double>(step_done.back() - step_done[2]).count();
  const double step_ms = secs * 1e3 / static_cast<double>(b.steps - 3);
  const Backend& be = engine.backend();  // the weights may be narrower than the cache (16-bit on the CPU)
  const double positions = static_cast<double>(batch) * (static_cast<double>(b.ctx) + b.steps / 2.0);
  const double bytes =
      rank_step_bytes(c, engine.plan(), dtype_size(be.weight_dtype()), dtype_size(be.act_dtype()), positions);
  const double gbs = bytes / (step_ms * 1e-3) / 1e9;  // one rank's
  const GraphTimes graph = graph_ms_per_step(engine);
  return {{"batch", batch},
          {"tok_per_s", static_cast<double>(batch) * 1e3 / step_ms},
          {"ms_per_step", step_ms},
          {"gb_per_s", gbs},
          {"graph_ms_per_step", graph.back_to_back},
          {"graph_synced_ms_per_step", graph.synced},
          {"graph_queued_ms_per_step", graph.queued},
          {"pct_of_copy", copy_gbs > 0 ? 100.0 * gbs / copy_gbs : 0.0},
          {"collective_ms_per_step", collective_ms_per_step(engine, batch, !b.engine.eager)}};
}

nlohmann::json bench_prefill(Engine& engine, const BenchConfig& b, std::mt19937& rng) {
  const ModelConfig& c = engine.config();
  Generator gen(engine.group());
  const GenerationRequest r{.prompt = random_prompt(b.prefill, c.vocab_size, rng), .max_new_tokens = 1};
  gen.generate({r}, false);  // warm-up
  std::vector<double> runs;
  for (int64_t i = 0; i < *b.prefill_runs; ++i) {
    const auto start = Clock::now();
    gen.generate({r}, false);
    runs.push_back(seconds_since(start));
  }
  std::vector<double> sorted = runs;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double secs = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
  const double p = static_cast<double>(b.prefill);
  const double matmul = 2.0 * weight_bytes(c, 1) * p - 2.0 * static_cast<double>(c.vocab_size) * c.hidden_size * (p - 1);
  const double attn = 4.0 * (p * (p + 1) / 2.0) * static_cast<double>(c.num_layers * c.q_dim());
  return {{"tokens", b.prefill},
          {"step_tokens", engine.group().runner().limits().max_step_tokens},
          {"seconds", secs},
          {"runs_seconds", runs},
          {"tok_per_s", p / secs},
          {"tflop_per_s", (matmul + attn) / secs / 1e12}};
}

// --batch, --ctx, --steps and --prefill, before any loading.
std::vector<int64_t> checked_batches(const BenchConfig& b) {
  std::vector<int64_t> batches = parse_int_list(b.batches, "--batch", "batch size");
  for (int64_t v : batches)
    LS_REQUIRE(v >= 1 && v <= EngineOptions::kMaxBatch, ErrorKind::kInvalidArgument,
               "--batch sizes must be from 1 to {}, got {}", EngineOptions::kMaxBatch, v);
  LS_REQUIRE(b.ctx >= 1, ErrorKind::kInvalidArgument, "--ctx must be >= 1, got {}", b.ctx);
  LS_REQUIRE(b.prefill >= 1, ErrorKind::kInvalidArgument, "--prefill must be >= 1, got {}", b.prefill);
  if (b.prefill_runs)
    LS_REQUIRE(*b.prefill_runs >= 1 && *b.prefill_runs <= 1000, ErrorKind::kInvalidArgument,
               "--prefill-runs must be from 1 to 1000, got {}", *b.prefill_runs);
  LS_REQUIRE(b.steps > 4, ErrorKind::kInvalidArgument, "bench needs --steps > 4, got {}", b.steps);
  constexpr int64_t kMost = int64_t{1} << 30;  // positions are 32-bit
  for (const auto& [flag, value] : {std::pair{"--ctx", b.ctx}, {"--prefill", b.prefill}, {"--steps", b.steps}})
    LS_REQUIRE(value <= kMost, ErrorKind::kInvalidArgument, "{} {} is above the limit of {}", flag, value, kMost);
  return batches;
}

int run_bench(BenchConfig& b) {
  const std::vector<int64_t> batches = checked_batches(b);
  b.sampling.validate();
  if (world().rank == 0 && !b.json.empty()) require_output_path(b.json, "--json");  // rank 0 writes it
  b.engine.max_batch = *std::max_element(batches.begin(), batches.end());
  b.engine.max_seq_len = std::max(b.ctx + b.steps, b.prefill + 1);
  b.engine.max_seq_len_origin = "bench's context (--ctx + --steps, or --prefill + 1)";
  // The prefill prompt in one step unless --max-step-tokens chunks it.
  if (b.engine.max_step_tokens == 0) b.engine.max_step_tokens = std::max<int64_t>(b.prefill, 256);
  b.engine.collective_timeout_s = world().collective_timeout_s;
  Engine engine(b.engine, *world().comm);
  // 2 GiB buffers on a GPU (as every figure in benchmarks/RESULTS.md), 512
  // MiB on the CPU: beyond its caches, within a laptop's memory.
  const bool gpu = engine.backend().device() >= 0;
  if (!b.prefill_runs) b.prefill_runs = gpu ? 5 : 1;
  const double copy_gbs = engine.backend().copy_bandwidth_gbs(gpu ? int64_t{2} << 30 : int64_t{512} << 20);
  std::mt19937 rng(1234);
  nlohmann::json report{{"model", b.engine.model_name()}, {"backend", b.engine.backend},
                        {"dtype", dtype_name(engine.backend().act_dtype())}, {"graphs", !b.engine.eager}, {"pdl", !b.engine.no_pdl}, {"sync_steps", b.engine.sync_steps},
                        {"ctx", b.ctx}, {"steps", b.steps}, {"copy_gb_per_s", copy_gbs},
                        {"sampling", {{"temperature", b.sampling.temperature}, {"top_k", b.sampling.top_k},
                                      {"top_p", b.sampling.top_p}}},
                        {"load_seconds", engine.load_seconds()}};
  report["prefill"] = bench_prefill(engine, b, rng);
  for (int64_t batch : batches) report["decode"].push_back(bench_decode(engine, batch, b, copy_gbs, rng));
  const double used_gib = static_cast<double>(engine.backend().memory_used_bytes()) / (int64_t{1} << 30);
  report[gpu ? "gpu_memory_used_gib" : "host_memory_used_gib"] = used_gib;
  if (world().rank != 0) return 0;
  std::cout << fmt::format("copy bandwidth {:.0f} GB/s ({}); load {:.1f} s; {} {:.1f} GiB\n", copy_gbs,
                           gpu ? "device to device" : fmt::format("host, {} threads", cpu::threads()),
                           engine.load_seconds(), gpu ? "GPU memory used" : "host memory used (resident set)",
                           used_gib);
  const auto& pf = report["prefill"];
  const auto runs = pf["runs_seconds"].get<std::vector<double>>();
  const std::string spread =
      runs.size() == 1 ? std::string("1 run")
                       : fmt::format("median of {} runs, {:.1f}-{:.1f} ms", runs.size(),
                                     1e3 * *std::min_element(runs.begin(), runs.end()),
                                     1e3 * *std::max_element(runs.begin(), runs.end()));
  std::cout << fmt::format("prefill {} tokens (steps of up to {}; {}): {:.0f} tok/s, {:.1f} TFLOP/s\n", b.prefill,
                           pf["step_tokens"].get<int64_t>(), spread, pf["tok_per_s"].get<double>(),
                           pf["tflop_per_s"].get<double>());
  std::cout << fmt::format("{} rank(s) via {}; decode sampling: temperature {} top-k {} top-p {}\n", world().size,
                           engine.group().comm().name(), b.sampling.temperature, b.sampling.top_k, b.sampling.top_p);
  std::cout << "batch  tok/s      ms/step  graph ms/step (synced, queued)  GB/s/rank %copy  collectives ms/step (alone)\n";
  for (const auto& d : report["decode"]) {
    const double graph_ms = d["graph_ms_per_step"].get<double>();  // 0: no graphs (eager, or the CPU)
    const std::string graph =
        graph_ms > 0 ? fmt::format("{:<6.3f} ({:.3f}, {:.3f})", graph_ms, d["graph_synced_ms_per_step"].get<double>(),
                                   d["graph_queued_ms_per_step"].get<double>())
                     : std::string("-");
    std::cout << fmt::format("{:<6} {:<10.1f} {:<8.3f} {:<31} {:<9.0f} {:<6.1f} {:.3f}\n", d["batch"].get<int64_t>(),
                             d["tok_per_s"].get<double>(), d["ms_per_step"].get<double>(), graph,
                             d["gb_per_s"].get<double>(), d["pct_of_copy"].get<double>(),
                             d["collective_ms_per_step"].get<double>());
  }
  if (!b.json.empty()) {
    std::ofstream out(b.json);
    out << report.dump(2) << "\n";
    LS_REQUIRE(out.good(), ErrorKind::kIo, "cannot write {}", b.json);
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& root, CommandTable& table) {
  auto b = std::make_shared<BenchConfig>();
  CLI::App* cmd = root.add_subcommand("bench", "decode and prefill speed on random prompts");
  auto* model = cmd->add_option("--model", b->engine.model_dir, "Hugging Face model folder");
  auto* preset = cmd->add_option("--preset", b->engine.preset,
                  "instead of --model: random bf16 weights of a make-model preset (tiny, small, llama3-8b, "
                  "llama3-70b, qwen3-8b), generated in memory, no checkpoint")
      ->excludes(model);
  cmd->add_option("--arch", b->engine.preset_arch, "the preset's architecture (llama, mistral, qwen2, qwen3)")
      ->capture_default_str()
      ->needs(preset);
  b->engine.backend = default_backend();
  b->engine.local_rank = world().local_rank;
  b->engine.local_ranks = world().local_size;
  cmd->add_option("--backend", b->engine.backend, "cpu or cuda")->capture_default_str();
  cmd->add_option("--dtype", b->engine.dtype, "compute dtype (see generate)")->capture_default_str();
  cmd->add_flag("--eager", b->engine.eager, "no CUDA graphs");
  cmd->add_flag("--no-pdl", b->engine.no_pdl, "no programmatic dependent launch");
  cmd->add_flag("--sync-steps", b->engine.sync_steps, "no decode step queued before the last one's tokens are in");
  cmd->add_option("--comm", b->engine.comm, "tensor-parallel transport (see generate)")->capture_default_str();
  cmd->add_option("--devices", b->engine.devices, "GPU of each local rank")->delimiter(',');
  cmd->add_option("--batch", b->batches, "comma-separated decode batch sizes")->capture_default_str();
  cmd->add_option("--ctx", b->ctx, "prompt tokens per sequence before decoding")->capture_default_str();
  cmd->add_option("--steps", b->steps, "decode steps per batch size")->capture_default_str();
  cmd->add_option("--prefill", b->prefill, "prompt tokens of the prefill measurement")->capture_default_str();
  cmd->add_option("--prefill-runs", b->prefill_runs,
                  "timed prefill runs, the median reported (default 5 on a GPU, 1 on the CPU)");
  cmd->add_option("--max-step-tokens", b->engine.max_step_tokens,
                  "prefill the prompt in chunks of this many tokens (default: in one step)");
  cmd->add_option("--temperature", b->sampling.temperature, "decode sampling (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", b->sampling.top_k, "decode sampling: 0 = no limit")->capture_default_str();
  cmd->add_option("--top-p", b->sampling.top_p, "decode sampling: nucleus in (0, 1]")->capture_default_str();
  cmd->add_option("--json", b->json, "also write the figures to this JSON file");
  table.add(cmd, [b] { return run_bench(*b); });
}

}  // namespace lockstep::cli
