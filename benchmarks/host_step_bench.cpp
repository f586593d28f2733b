// The host's own work per decode step, without a device: the Generator,
// TpGroup and Runner over a backend whose ops do nothing and whose graphs
// replay nothing. What is timed is this project's C++ between steps (building
// the batch, padding it to its bucket, validating and packing it for the
// upload, the greedy pick from the per-rank maxima), not CUDA's API calls or
// the GPU: on a GPU machine, `bench`'s ms/step against its "synced" column is
// the whole gap, this the share of it that is ours.
// Run: build/host_step_bench [steps] (a `small` model written to a temporary folder)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <unistd.h>
#include <vector>

#include "engine/backend.h"
#include "engine/generate.h"
#include "engine/model_writer.h"
#include "engine/runner.h"
#include "engine/weights.h"
#include "tp/communicator.h"
#include "tp/group.h"

namespace {

using namespace lockstep;

// Zeroed host memory and ops that do nothing: every argmax says token 0.
class NullBackend final : public Backend {
 public:
  std::string name() const override { return "null"; }
  DType act_dtype() const override { return DType::kF32; }
  DType weight_dtype() const override { return DType::kF32; }
  Buffer alloc(int64_t bytes) override {
    void* p = std::calloc(1, static_cast<size_t>(bytes > 0 ? bytes : 1));
    return Buffer(p, bytes, [](void* q) { std::free(q); });
  }
  void to_backend(void* dst, const void* src, int64_t bytes) override { cpu_->to_backend(dst, src, bytes); }
  void to_host(void* dst, const void* src, int64_t bytes) override { cpu_->to_host(dst, src, bytes); }
  void copy_within(void* dst, const void* src, int64_t bytes) override { cpu_->copy_within(dst, src, bytes); }
  Buffer alloc_host_visible(int64_t bytes) override { return alloc(bytes); }
  double copy_bandwidth_gbs(int64_t bytes) override { return cpu_->copy_bandwidth_gbs(bytes); }
  int64_t memory_used_bytes() const override { return cpu_->memory_used_bytes(); }
  void synchronize() override {}
  void embedding(const EmbeddingParams&) override {}
  void linear(const LinearParams&) override {}
  void attention(const AttentionParams&) override {}
  void argmax(const ArgmaxParams&) override {}
  void sample(const SampleParams&) override {}
  void next_tokens(const NextTokensParams&) override {}
  bool supports_graphs() const override { return true; }
  void capture_begin() override {}
  void capture_end(int64_t) override {}
  void replay(int64_t) override {}

 private:
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();  // its host copies
};

// Microseconds of host work per decode step at `batch` sequences.
double us_per_step(TpGroup& group, int64_t batch, int64_t steps) {
  std::vector<GenerationRequest> requests(static_cast<size_t>(batch));
  for (auto& r : requests) r = GenerationRequest{.prompt = {1, 2, 3}, .max_new_tokens = steps};
  std::vector<std::chrono::steady_clock::time_point> done;
  Generator gen(group);
  gen.generate(requests, false, [&](size_t seq, int32_t) {
    if (seq + 1 == requests.size()) done.push_back(std::chrono::steady_clock::now());
  });
  return std::chrono::duration<double, std::micro>(done.back() - done[2]).count() /
         static_cast<double>(done.size() - 3);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 2000;
  const auto dir = std::filesystem::temp_directory_path() / ("lockstep_host_step_" + std::to_string(::getpid()));
  write_random_model(MakeModelOptions{.shape = model_preset("small", Arch::kLlama), .dtype = DType::kF32,
                                      .seed = 1, .out = dir});
  const ModelConfig config = load_model_config(dir);
  const ShardPlan plan = ShardPlan::make(config, 0, 1);
  auto comm = make_single_rank_communicator();
  NullBackend backend;
  TensorStore store(dir);
  ModelWeights weights = load_weights(store, config, plan, *comm, backend, nullptr);
  const RunnerLimits limits{.max_slots = 64, .max_seq = steps + 8, .max_step_tokens = 2048, .max_logit_rows = 64};
  Runner runner(config, plan, std::move(weights), backend, limits, Diagnostics{});
  TpGroup group(*comm, runner, true);
  std::printf("%6s %12s\n", "batch", "us/step");
  for (int64_t batch : {1, 8, 32, 64}) std::printf("%6lld %12.2f\n", static_cast<long long>(batch), us_per_step(group, batch, steps));
  std::filesystem::remove_all(dir);
  return 0;
}
