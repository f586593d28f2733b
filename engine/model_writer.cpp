#include "engine/model_writer.h"

#include <cmath>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/io/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {

namespace {

using nlohmann::ordered_json;

struct PresetShape {
  const char* name;
  int64_t hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos;
  double eps, theta;
  bool llama3_rope;
};

constexpr PresetShape kPresets[] = {
    {"tiny", 64, 128, 2, 4, 2, 16, 512, 512, 1e-5, 10000.0, false},
    {"small", 768, 2048, 12, 12, 4, 64, 16384, 2048, 1e-5, 10000.0, false},
    {"llama3-8b", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 1e-5, 500000.0, true},
    {"llama3-70b", 8192, 28672, 80, 64, 8, 128, 128256, 131072, 1e-5, 500000.0, true},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e-6, 1000000.0, false},
};

// Counter-based generator: the value of element i of tensor t depends only on
// (seed, t, i), so tensors can be produced in any chunking.
inline float uniform_pm1(uint64_t seed, uint64_t tensor, uint64_t i) {
  uint64_t z = seed * 0x9e3779b97f4a7c15ull + (tensor << 40) + i + 0x632be59bd9b4e019ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

struct TensorPlan {
  TensorSpec spec;
  float offset;  // value = offset + scale · uniform(-1, 1)
  float scale;
};

std::vector<TensorPlan> plan_tensors(const ModelConfig& c, DType dtype) {
  const float w = 0.02f * std::sqrt(3.0f);  // uniform with std 0.02
  std::vector<TensorPlan> t;
  auto add = [&](std::string name, std::vector<int64_t> shape, float offset, float scale) {
    t.push_back({TensorSpec{std::move(name), dtype, std::move(shape)}, offset, scale});
  };
  const int64_t h = c.hidden_size;
  add("model.embed_tokens.weight", {c.vocab_size, h}, 0.0f, w);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto n = [l](const char* s) { return fmt::format("model.layers.{}.{}", l, s); };
    add(n("input_layernorm.weight"), {h}, 1.0f, 0.1f);
    add(n("self_attn.q_proj.weight"), {c.q_dim(), h}, 0.0f, w);
    add(n("self_attn.k_proj.weight"), {c.kv_dim(), h}, 0.0f, w);
    add(n("self_attn.v_proj.weight"), {c.kv_dim(), h}, 0.0f, w);
    if (c.qkv_bias) {
      add(n("self_attn.q_proj.bias"), {c.q_dim()}, 0.0f, w);
      add(n("self_attn.k_proj.bias"), {c.kv_dim()}, 0.0f, w);
      add(n("self_attn.v_proj.bias"), {c.kv_dim()}, 0.0f, w);
    }
    if (c.qk_norm) {
      add(n("self_attn.q_norm.weight"), {c.head_dim}, 1.0f, 0.1f);
      add(n("self_attn.k_norm.weight"), {c.head_dim}, 1.0f, 0.1f);
    }
    add(n("self_attn.o_proj.weight"), {h, c.q_dim()}, 0.0f, w);
    if (c.o_bias) add(n("self_attn.o_proj.bias"), {h}, 0.0f, w);
    add(n("post_attention_layernorm.weight"), {h}, 1.0f, 0.1f);
    add(n("mlp.gate_proj.weight"), {c.intermediate_size, h}, 0.0f, w);
    add(n("mlp.up_proj.weight"), {c.intermediate_size, h}, 0.0f, w);
    add(n("mlp.down_proj.weight"), {h, c.intermediate_size}, 0.0f, w);
  }
  add("model.norm.weight", {h}, 1.0f, 0.1f);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h}, 0.0f, w);
  return t;
}

ordered_json config_json(const ModelConfig& c, DType dtype, ConfigStyle style) {
  ordered_json j;
  j["architectures"] = {arch_hf_class(c.arch)};
  j["model_type"] = arch_name(c.arch);
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch != Arch::kQwen2) j["attention_bias"] = c.o_bias;
  if (c.arch == Arch::kQwen2 || c.arch == Arch::kQwen3) j["use_sliding_window"] = false;
  // Mistral without the key means transformers' default window of 4096.
  if (c.arch == Arch::kMistral)
    j["sliding_window"] = c.sliding_window > 0 ? ordered_json(c.sliding_window) : ordered_json(nullptr);
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_ids.size() == 1 ? ordered_json(c.eos_token_ids[0]) : ordered_json(c.eos_token_ids);
  ordered_json rope;
  rope["rope_type"] = c.rope.type == RopeType::kLlama3 ? "llama3" : "default";
  if (c.rope.type == RopeType::kLlama3) {
    rope["factor"] = c.rope.factor;
    rope["low_freq_factor"] = c.rope.low_freq_factor;
    rope["high_freq_factor"] = c.rope.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope.original_max_position;
  }
  if (style == ConfigStyle::kClassic) {
    j["rope_theta"] = c.rope.theta;
    j["rope_scaling"] = c.rope.type == RopeType::kLlama3 ? rope : ordered_json(nullptr);
    j["torch_dtype"] = dtype_name(dtype);
  } else {
    rope["rope_theta"] = c.rope.theta;
    j["rope_parameters"] = rope;
    j["dtype"] = dtype_name(dtype);
  }
  return j;
}

void write_json(const std::filesystem::path& path, const ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  LS_REQUIRE(out.good(), ErrorKind::kIo, "cannot write {}", path.string());
}

uint64_t spec_bytes(const TensorSpec& spec) {
  uint64_t n = 1;
  for (int64_t d : spec.shape) n *= static_cast<uint64_t>(d);
  return n * dtype_size(spec.dtype);
}

// Splits the tensors into shards of at most max_shard_bytes (a tensor larger
// than that gets a shard of its own) and writes each, streaming.
void write_tensors(const MakeModelOptions& o, const std::vector<GeneratedTensor>& tensors) {
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = spec_bytes(tensors[i].spec);
    if (!shards.back().empty() && in_shard + bytes > static_cast<uint64_t>(o.max_shard_bytes)) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += bytes;
  }
  ordered_json weight_map = ordered_json::object();
  uint64_t total = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string file = shards.size() == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<TensorSpec> specs;
    for (size_t i : shards[s]) {
      specs.push_back(tensors[i].spec);
      weight_map[tensors[i].spec.name] = file;
      total += spec_bytes(tensors[i].spec);
    }
    const std::vector<size_t>& members = shards[s];
    write_safetensors(o.out / file, specs,
                      [&](size_t k, int64_t offset, int64_t count, float* dst) {
                        tensors[members[k]].fill(offset, count, dst);
                      },
                      {{"format", "pt"}});
    spdlog::info("wrote {}", (o.out / file).string());
  }
  if (shards.size() > 1)
    write_json(o.out / "model.safetensors.index.json",
               ordered_json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
}

ModelConfig complete_random_shape(const ModelConfig& shape) {
  ModelConfig c = shape;
  c.qkv_bias = c.arch == Arch::kQwen2 || c.o_bias;
  c.qk_norm = c.arch == Arch::kQwen3;
  c.bos_token_id = static_cast<int32_t>(c.vocab_size - 2);
  c.eos_token_ids = {static_cast<int32_t>(c.vocab_size - 1)};
  return c;
}

std::vector<GeneratedTensor> generated_tensors(const ModelConfig& c, DType dtype, uint64_t seed) {
  auto plans = std::make_shared<const std::vector<TensorPlan>>(plan_tensors(c, dtype));
  std::vector<GeneratedTensor> tensors;
  for (size_t idx = 0; idx < plans->size(); ++idx)
    tensors.push_back({(*plans)[idx].spec, [plans, idx, seed](int64_t first, int64_t count, float* dst) {
                         const TensorPlan& p = (*plans)[idx];
                         for (int64_t e = 0; e < count; ++e)
                           dst[e] = p.offset + p.scale * uniform_pm1(seed, idx, static_cast<uint64_t>(first + e));
                       }});
  return tensors;
}

}  // namespace

void MakeModelOptions::validate() const {
  shape.validate();
  LS_REQUIRE(!out.empty(), ErrorKind::kInvalidArgument, "--out is required");
  LS_REQUIRE(max_shard_bytes > 0, ErrorKind::kInvalidArgument, "--max-shard-bytes must be positive");
}

ModelConfig model_preset(const std::string& preset, Arch arch) {
  for (const auto& p : kPresets) {
    if (preset != p.name) continue;
    ModelConfig c;
    c.arch = arch;
    c.hidden_size = p.hidden;
    c.intermediate_size = p.intermediate;
    c.num_layers = p.layers;
    c.num_heads = p.heads;
    c.num_kv_heads = p.kv_heads;
    c.head_dim = p.head_dim;
    c.vocab_size = p.vocab;
    c.max_position_embeddings = p.max_pos;
    c.rms_norm_eps = p.eps;
    c.rope.theta = p.theta;
    if (p.llama3_rope) c.rope = RopeConfig{RopeType::kLlama3, p.theta, 8.0, 1.0, 4.0, 8192};
    c.qkv_bias = arch == Arch::kQwen2;
    c.qk_norm = arch == Arch::kQwen3;
    return c;
  }
  LS_FAIL(ErrorKind::kInvalidArgument, "unknown preset '{}' (tiny, small, llama3-8b, llama3-70b, qwen3-8b)", preset);
}

RandomModel random_model(const ModelConfig& shape, DType dtype, uint64_t seed) {
  const ModelConfig c = complete_random_shape(shape);
  c.validate();
  return {.config = parse_model_config(nlohmann::json::parse(config_json(c, dtype, ConfigStyle::kClassic).dump())),
          .tensors = generated_tensors(c, dtype, seed)};
}

namespace {

// Fails before anything is written when --out is a file, or when the weights'
// bytes exceed the free space where they would go (the nearest existing
// folder of --out).
void check_output_room(const std::filesystem::path& out, uint64_t bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  LS_REQUIRE(!fs::exists(out, ec) || fs::is_directory(out, ec), ErrorKind::kInvalidArgument,
             "--out {} is a file, not a folder", out.string());
  fs::path existing = fs::absolute(out, ec);
  while (!existing.empty() && !fs::exists(existing, ec) && existing != existing.parent_path())
    existing = existing.parent_path();
  const fs::space_info room = fs::space(existing, ec);
  if (ec) return;  // unknown: the writes themselves report a full disk
  LS_REQUIRE(bytes <= room.available, ErrorKind::kInvalidArgument,
             "--out {}: the model's weights take {:.2f} GB, but {} has {:.2f} GB free", out.string(),
             static_cast<double>(bytes) / 1e9, existing.string(), static_cast<double>(room.available) / 1e9);
}

}  // namespace

void write_random_model(const MakeModelOptions& options) {
  MakeModelOptions o = options;
  o.shape = complete_random_shape(o.shape);
  o.validate();
  const std::vector<GeneratedTensor> tensors = generated_tensors(o.shape, o.dtype, o.seed);
  uint64_t bytes = 0;
  for (const GeneratedTensor& t : tensors) bytes += spec_bytes(t.spec);
  check_output_room(o.out, bytes);
  std::filesystem::create_directories(o.out);
  write_json(o.out / "config.json", config_json(o.shape, o.dtype, o.style));
  write_json(o.out / "generation_config.json",
             ordered_json{{"bos_token_id", o.shape.bos_token_id}, {"eos_token_id", o.shape.eos_token_ids[0]},
                          {"do_sample", false}});
  write_tensors(o, tensors);
  // A byte-level BPE tokenizer needs 256 byte ids plus the two special ones.
  if (o.write_tokenizer && o.shape.vocab_size >= 260)
    write_byte_level_bpe_tokenizer(o.out / "tokenizer.json", static_cast<int32_t>(o.shape.vocab_size));
}

}  // namespace lockstep
