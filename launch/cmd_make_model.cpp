// make-model: writes a random-weight model in the Hugging Face layout.
#include <memory>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/model_writer.h"
#include "launch/commands.h"
#include "launch/world.h"

namespace lockstep::cli {

namespace {

struct MakeModelArgs {
  std::string arch = "llama";
  std::string preset = "tiny";
  std::string dtype = "bf16";
  std::string out;
  std::string config_style = "classic";
  uint64_t seed = 0;
  int64_t max_shard_bytes = 5'000'000'000;
  // Overrides of the preset's shape (unset: the preset's value).
  std::optional<int64_t> hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
  std::optional<double> eps, theta;
  bool tie = false;
  bool attention_bias = false;
  bool llama3_rope = false;
};

template <typename T>
void apply(const std::optional<T>& v, T& field) {
  if (v) field = *v;
}

int run_make_model(const MakeModelArgs& a) {
  if (world().rank != 0) return 0;  // under mpirun, rank 0 writes
  MakeModelOptions o;
  o.shape = model_preset(a.preset, parse_arch_short_name(a.arch));
  ModelConfig& s = o.shape;
  apply(a.hidden, s.hidden_size);
  apply(a.intermediate, s.intermediate_size);
  apply(a.layers, s.num_layers);
  apply(a.heads, s.num_heads);
  apply(a.kv_heads, s.num_kv_heads);
  if (a.hidden && !a.head_dim && (a.heads || a.hidden)) s.head_dim = s.hidden_size / s.num_heads;
  apply(a.head_dim, s.head_dim);
  apply(a.vocab, s.vocab_size);
  apply(a.max_pos, s.max_position_embeddings);
  apply(a.eps, s.rms_norm_eps);
  apply(a.theta, s.rope.theta);
  if (a.tie) s.tie_word_embeddings = true;
  // Qwen2's q/k/v always have biases and its o_proj never has one (its
  // config has no attention_bias key): the flag would write unread tensors.
  LS_REQUIRE(!a.attention_bias || s.arch != Arch::kQwen2, ErrorKind::kInvalidArgument,
             "--attention-bias: qwen2 always has q/k/v biases and no o_proj bias (the flag is for llama, mistral "
             "and qwen3)");
  if (a.attention_bias) s.o_bias = true;
  if (a.llama3_rope) s.rope = RopeConfig{RopeType::kLlama3, s.rope.theta, 8.0, 1.0, 4.0, 64};
  o.dtype = parse_dtype_name(a.dtype);
  o.seed = a.seed;
  o.out = a.out;
  o.max_shard_bytes = a.max_shard_bytes;
  LS_REQUIRE(a.config_style == "classic" || a.config_style == "transformers5", ErrorKind::kInvalidArgument,
             "--config-style must be classic or transformers5, got '{}'", a.config_style);
  o.style = a.config_style == "classic" ? ConfigStyle::kClassic : ConfigStyle::kTransformers5;
  write_random_model(o);
  spdlog::info("wrote {} model '{}' to {}", a.arch, a.preset, a.out);
  return 0;
}

}  // namespace

void add_make_model_command(CLI::App& root, CommandTable& table) {
  auto a = std::make_shared<MakeModelArgs>();
  CLI::App* c = root.add_subcommand("make-model", "write a random-weight model in the Hugging Face layout");
  c->add_option("--arch", a->arch, "llama, mistral, qwen2 or qwen3")->capture_default_str();
  c->add_option("--preset", a->preset, "tiny, small, llama3-8b, llama3-70b, qwen3-8b")->capture_default_str();
  c->add_option("--out", a->out, "output folder")->required();
  c->add_option("--seed", a->seed, "weights seed")->capture_default_str()->check(unsigned_integer());
  c->add_option("--dtype", a->dtype, "bf16, f16 or f32")->capture_default_str();
  c->add_option("--max-shard-bytes", a->max_shard_bytes, "shard the weights above this size")->capture_default_str();
  c->add_option("--config-style", a->config_style, "classic (rope_theta, torch_dtype) or transformers5")
      ->capture_default_str();
  c->add_option("--hidden-size", a->hidden);
  c->add_option("--intermediate-size", a->intermediate);
  c->add_option("--num-layers", a->layers);
  c->add_option("--num-heads", a->heads);
  c->add_option("--num-kv-heads", a->kv_heads);
  c->add_option("--head-dim", a->head_dim);
  c->add_option("--vocab-size", a->vocab);
  c->add_option("--max-position-embeddings", a->max_pos);
  c->add_option("--rms-norm-eps", a->eps);
  c->add_option("--rope-theta", a->theta);
  c->add_flag("--tie-word-embeddings", a->tie);
  c->add_flag("--attention-bias", a->attention_bias, "o_proj (and q/k/v) biases");
  c->add_flag("--llama3-rope", a->llama3_rope, "llama3 rope scaling (factor 8, original context 64)");
  table.add(c, [a] { return run_make_model(*a); });
}

}  // namespace lockstep::cli
