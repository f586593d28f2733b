#include "engine/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numbers>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file.h"
#include "common/json_sax.h"

namespace lockstep {

namespace {

using nlohmann::json;

struct ArchEntry {
  Arch arch;
  const char* short_name;
  const char* hf_class;
  int64_t default_max_positions;  // the transformers class default
};

constexpr ArchEntry kArchs[] = {
    {Arch::kLlama, "llama", "LlamaForCausalLM", 2048},
    {Arch::kMistral, "mistral", "MistralForCausalLM", 4096 * 32},
    {Arch::kQwen2, "qwen2", "Qwen2ForCausalLM", 32768},
    {Arch::kQwen3, "qwen3", "Qwen3ForCausalLM", 32768},
};

const ArchEntry& arch_entry(Arch a) {
  for (const auto& e : kArchs)
    if (e.arch == a) return e;
  LS_FAIL(ErrorKind::kInternal, "unknown arch enum");
}

[[noreturn]] void config_error(const std::string& what) {
  LS_FAIL(ErrorKind::kModel, "config.json: {}", what);
}

int64_t int_value(const json& v, const char* key) {
  if (!v.is_number_integer()) config_error(fmt::format("'{}' must be an integer, got {}", key, v.dump()));
  // nlohmann keeps 2^63..2^64-1 unsigned; read as int64 they would wrap.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    config_error(fmt::format("'{}' is too large, got {}", key, v.dump()));
  return v.get<int64_t>();
}

int64_t get_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) config_error(fmt::format("missing '{}'", key));
  return int_value(*it, key);
}

int64_t get_int_or(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return int_value(*it, key);
}

double get_number(const json& j, const char* key, const char* where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) config_error(fmt::format("missing '{}'{}", key, where));
  if (!it->is_number()) config_error(fmt::format("'{}' must be a number, got {}", key, it->dump()));
  return it->get<double>();
}

bool get_bool_or(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) config_error(fmt::format("'{}' must be true or false, got {}", key, it->dump()));
  return it->get<bool>();
}

Arch parse_architecture(const json& j) {
  auto it = j.find("architectures");
  if (it == j.end() || it->is_null()) config_error("missing 'architectures' (expected e.g. [\"LlamaForCausalLM\"])");
  if (!it->is_array() || it->empty() || !(*it)[0].is_string())
    config_error(fmt::format("'architectures' must be a list of class names (e.g. [\"LlamaForCausalLM\"]), got {}",
                             it->dump()));
  std::string name = (*it)[0].get<std::string>();
  for (const auto& e : kArchs) {
    if (name != e.hf_class) continue;
    // transformers picks the model's classes by model_type: one that names
    // another family would run a different model than `architectures`.
    auto type = j.find("model_type");
    if (type != j.end() && !type->is_null() && !(type->is_string() && type->get<std::string>() == e.short_name))
      config_error(fmt::format("model_type {} does not match architectures [\"{}\"] (expected \"{}\")", type->dump(),
                               name, e.short_name));
    return e.arch;
  }
  config_error(fmt::format("unsupported architecture '{}' (supported: LlamaForCausalLM, "
                           "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", name));
}

// The rope type's own keys, from `typed` (rope_parameters or rope_scaling).
// Defaults and fallbacks follow transformers' modeling_rope_utils.py (5.17):
// original_max_position_embeddings at the top level wins over the one in the
// rope keys, which defaults to max_position_embeddings; yarn's factor
// defaults to the ratio of the two; a missing or zero beta takes its default.
void parse_rope_scaling(const json& j, const json& typed, const char* where, int64_t max_positions,
                        RopeConfig& rope) {
  const auto number_or = [&](const char* key, double fallback) {
    auto it = typed.find(key);
    return it == typed.end() || it->is_null() ? fallback : get_number(typed, key, where);
  };
  rope.original_max_position = get_int_or(j, "original_max_position_embeddings",
                                          get_int_or(typed, "original_max_position_embeddings", max_positions));
  switch (rope.type) {
    case RopeType::kDefault:
      return;
    case RopeType::kLinear:
    case RopeType::kDynamic:
      rope.factor = get_number(typed, "factor", where);
      return;
    case RopeType::kLlama3:
      rope.factor = get_number(typed, "factor", where);
      rope.low_freq_factor = get_number(typed, "low_freq_factor", where);
      rope.high_freq_factor = get_number(typed, "high_freq_factor", where);
      return;
    case RopeType::kYarn: {
      rope.factor = number_or("factor", static_cast<double>(max_positions) /
                                            static_cast<double>(std::max<int64_t>(rope.original_max_position, 1)));
      const auto mscale = [&](double m) { return rope.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(rope.factor) + 1.0; };
      const double m = number_or("mscale", 0.0), m_all = number_or("mscale_all_dim", 0.0);
      rope.attention_factor =
          number_or("attention_factor", m != 0.0 && m_all != 0.0 ? mscale(m) / mscale(m_all) : mscale(1.0));
      rope.beta_fast = number_or("beta_fast", 0.0);
      if (rope.beta_fast == 0.0) rope.beta_fast = 32.0;
      rope.beta_slow = number_or("beta_slow", 0.0);
      if (rope.beta_slow == 0.0) rope.beta_slow = 1.0;
      rope.truncate = get_bool_or(typed, "truncate", true);
      return;
    }
  }
}

// Classic configs put rope_theta at the top and scaling under rope_scaling;
// transformers-5 configs put both under rope_parameters.
RopeConfig parse_rope(const json& j, int64_t max_positions) {
  RopeConfig rope;
  const json* params = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) config_error("'rope_parameters' must be an object");
    params = &*it;
  }
  const json* scaling = nullptr;
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) config_error("'rope_scaling' must be an object or null");
    scaling = &*it;
  }
  if (params != nullptr && params->contains("rope_theta"))
    rope.theta = get_number(*params, "rope_theta", " in rope_parameters");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    rope.theta = get_number(j, "rope_theta", "");
  const json* typed = params != nullptr ? params : scaling;
  std::string type = "default";
  if (typed != nullptr) {
    auto t = typed->find("rope_type");
    if (t == typed->end()) t = typed->find("type");
    if (t != typed->end() && !t->is_null()) {
      if (!t->is_string()) config_error("rope type must be a string");
      type = t->get<std::string>();
    }
  }
  constexpr RopeType kTypes[] = {RopeType::kDefault, RopeType::kLinear, RopeType::kDynamic, RopeType::kLlama3,
                                 RopeType::kYarn};
  const RopeType* known = std::find_if(std::begin(kTypes), std::end(kTypes),
                                       [&](RopeType t) { return type == rope_type_name(t); });
  if (known == std::end(kTypes))
    config_error(fmt::format("unsupported rope type '{}' (supported: default, linear, dynamic, llama3, yarn)", type));
  rope.type = *known;
  if (typed != nullptr)
    parse_rope_scaling(j, *typed, params != nullptr ? " in rope_parameters" : " in rope_scaling", max_positions, rope);
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null() &&
      get_number(j, "partial_rotary_factor", "") != 1.0)
    config_error("unsupported partial_rotary_factor (only 1.0)");
  return rope;
}

void check_unsupported_features(const json& j) {
  std::string act = "silu";
  if (auto it = j.find("hidden_act"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) config_error("'hidden_act' must be a string");
    act = it->get<std::string>();
  }
  if (act != "silu") config_error(fmt::format("unsupported activation '{}' (only silu)", act));
  if (get_bool_or(j, "mlp_bias", false)) config_error("unsupported mlp_bias = true");
}

// Sliding-window attention as transformers applies it: the window (0: none)
// and the layers it applies to. Mistral windows every layer whenever
// sliding_window is set (its class default is 4096). Qwen2 and Qwen3 window
// only with use_sliding_window, and only the layers named
// "sliding_attention" in layer_types, by default those from
// max_window_layers on. Llama has none.
void parse_sliding_window(const json& j, ModelConfig& c) {
  constexpr int64_t kClassDefault = 4096;
  c.sliding_window = 0;
  c.windowed_layers.clear();
  if (c.arch == Arch::kLlama) return;
  const int64_t window = get_int_or(j, "sliding_window", j.contains("sliding_window") ? 0 : kClassDefault);
  if (window < 0) config_error(fmt::format("'sliding_window' must be positive, got {}", window));
  if (window == 0) return;
  if (c.arch == Arch::kMistral) {
    c.sliding_window = window;
    return;
  }
  if (!get_bool_or(j, "use_sliding_window", false)) return;
  std::vector<bool> windowed(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)));
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) != c.num_layers)
      config_error(fmt::format("'layer_types' must be a list of num_hidden_layers ({}) names", c.num_layers));
    for (size_t l = 0; l < windowed.size(); ++l) {
      const json& t = (*it)[l];
      if (t != "sliding_attention" && t != "full_attention")
        config_error(fmt::format("unsupported layer type {} in 'layer_types'", t.dump()));
      windowed[l] = t == "sliding_attention";
    }
  } else {
    const int64_t from = get_int_or(j, "max_window_layers", 28);
    for (size_t l = 0; l < windowed.size(); ++l) windowed[l] = static_cast<int64_t>(l) >= from;
  }
  if (std::none_of(windowed.begin(), windowed.end(), [](bool w) { return w; })) return;
  c.sliding_window = window;
  c.windowed_layers = std::move(windowed);
}

std::vector<int32_t> parse_token_ids(const json& v, const char* key) {
  std::vector<int32_t> ids;
  if (v.is_null()) return ids;
  const auto take = [&](const json& e) {
    if (!e.is_number_integer()) config_error(fmt::format("'{}' must hold integers", key));
    const auto id = e.get<int64_t>();
    if (id < 0 || id > INT32_MAX) config_error(fmt::format("{} {} outside the vocabulary", key, e.dump()));
    ids.push_back(static_cast<int32_t>(id));
  };
  if (v.is_number_integer()) {
    take(v);
  } else if (v.is_array()) {
    for (const auto& e : v) take(e);
  } else {
    config_error(fmt::format("'{}' must be an integer or a list of integers", key));
  }
  return ids;
}

json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_whole_file(path, "file");
  require_json_depth(text, ErrorKind::kModel, path.string());
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    LS_FAIL(ErrorKind::kModel, "{} is not valid JSON: {}", path.string(), e.what());
  }
}

}  // namespace

const char* arch_name(Arch a) { return arch_entry(a).short_name; }
const char* arch_hf_class(Arch a) { return arch_entry(a).hf_class; }

Arch parse_arch_short_name(const std::string& s) {
  for (const auto& e : kArchs)
    if (s == e.short_name) return e.arch;
  LS_FAIL(ErrorKind::kInvalidArgument, "unknown architecture '{}' (expected llama, mistral, qwen2 or qwen3)", s);
}

ModelConfig parse_model_config(const json& j) {
  if (!j.is_object()) config_error("top level must be a JSON object");
  ModelConfig c;
  c.arch = parse_architecture(j);
  check_unsupported_features(j);
  c.hidden_size = get_int(j, "hidden_size");
  c.intermediate_size = get_int(j, "intermediate_size");
  c.num_layers = get_int(j, "num_hidden_layers");
  c.num_heads = get_int(j, "num_attention_heads");
  c.num_kv_heads = get_int_or(j, "num_key_value_heads", c.num_heads);
  c.vocab_size = get_int(j, "vocab_size");
  if (c.num_heads <= 0) config_error("num_attention_heads must be positive");
  c.head_dim = get_int_or(j, "head_dim", c.hidden_size / c.num_heads);
  c.max_position_embeddings =
      get_int_or(j, "max_position_embeddings", arch_entry(c.arch).default_max_positions);
  c.rms_norm_eps = get_number(j, "rms_norm_eps", " (the RMSNorm epsilon is always read from the config)");
  c.rope = parse_rope(j, c.max_position_embeddings);
  parse_sliding_window(j, c);
  c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", false);
  bool attention_bias = get_bool_or(j, "attention_bias", false);
  c.qkv_bias = c.arch == Arch::kQwen2 || attention_bias;
  c.o_bias = c.arch != Arch::kQwen2 && attention_bias;
  c.qk_norm = c.arch == Arch::kQwen3;
  c.dtype = DType::kF32;
  for (const char* key : {"dtype", "torch_dtype"}) {  // transformers 5's name first
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) continue;
    try {
      c.dtype = parse_dtype_name(it->get<std::string>());
    } catch (const Error& e) {
      config_error(fmt::format("'{}': {}", key, e.what()));
    }
    break;
  }
  if (j.contains("eos_token_id")) c.eos_token_ids = parse_token_ids(j["eos_token_id"], "eos_token_id");
  // Informational only (the tokenizer's post-processor adds the BOS): a value
  // that is not an id (some configs write -1) is left out, not refused.
  if (auto it = j.find("bos_token_id"); it != j.end()) {
    const json& bos = it->is_array() && !it->empty() ? (*it)[0] : *it;
    if (bos.is_number_integer() && bos.get<int64_t>() >= 0 && bos.get<int64_t>() <= INT32_MAX)
      c.bos_token_id = bos.get<int32_t>();
  }
  c.validate();
  return c;
}

void ModelConfig::validate() const {
  auto positive = [](int64_t v, const char* name) {
    if (v <= 0) config_error(fmt::format("'{}' must be positive, got {}", name, v));
  };
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_layers, "num_hidden_layers");
  positive(num_heads, "num_attention_heads");
  positive(num_kv_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(vocab_size, "vocab_size");
  positive(max_position_embeddings, "max_position_embeddings");
  // Far above any model's, and small enough that sizes multiplied together
  // (q_dim, a layer's weights, the KV cache) stay within 64 bits.
  constexpr int64_t kMostDim = int64_t{1} << 24;
  auto at_most = [](int64_t v, int64_t most, const char* name) {
    if (v > most) config_error(fmt::format("'{}' {} is above the supported maximum {}", name, v, most));
  };
  at_most(hidden_size, kMostDim, "hidden_size");
  at_most(intermediate_size, kMostDim, "intermediate_size");
  at_most(num_layers, 4096, "num_hidden_layers");  // 32x the deepest released model's
  at_most(num_heads, kMostDim, "num_attention_heads");
  at_most(head_dim, kMostDim, "head_dim");
  at_most(num_heads * head_dim, kMostDim, "num_attention_heads * head_dim");
  at_most(max_position_embeddings, INT32_MAX, "max_position_embeddings");
  if (sliding_window < 0) config_error(fmt::format("'sliding_window' must be positive, got {}", sliding_window));
  if (!windowed_layers.empty() && static_cast<int64_t>(windowed_layers.size()) != num_layers)
    config_error(fmt::format("{} windowed-layer flags for {} layers", windowed_layers.size(), num_layers));
  if (num_heads % num_kv_heads != 0)
    config_error(fmt::format("num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                             num_heads, num_kv_heads));
  if (head_dim % 2 != 0) config_error(fmt::format("head_dim must be even for RoPE, got {}", head_dim));
  if (vocab_size > INT32_MAX) config_error("vocab_size too large");
  if (!(rms_norm_eps > 0.0) || !(rms_norm_eps < 1.0))
    config_error(fmt::format("rms_norm_eps must be in (0, 1), got {}", rms_norm_eps));
  if (!(rope.theta > 0.0) || !std::isfinite(rope.theta))
    config_error(fmt::format("rope_theta must be positive and finite, got {}", rope.theta));
  if (rope.type != RopeType::kDefault && (!(rope.factor > 0) || !std::isfinite(rope.factor)))
    config_error(fmt::format("{} rope scaling needs a positive factor, got {}", rope_type_name(rope.type), rope.factor));
  if (rope.type == RopeType::kLlama3 &&
      (!(rope.high_freq_factor > rope.low_freq_factor) || !(rope.low_freq_factor > 0) ||
       rope.original_max_position <= 0))
    config_error("invalid llama3 rope scaling parameters");
  if (rope.type == RopeType::kYarn &&
      (rope.original_max_position <= 0 || !(rope.beta_fast > 0) || !(rope.beta_slow > 0) ||
       !(rope.attention_factor > 0) || !std::isfinite(rope.attention_factor)))
    config_error("invalid yarn rope scaling parameters");
  for (int32_t id : eos_token_ids)
    if (id < 0 || id >= vocab_size) config_error(fmt::format("eos_token_id {} outside the vocabulary", id));
}

int64_t ModelConfig::attention_window(int64_t layer) const {
  if (sliding_window == 0 || windowed_layers.empty()) return sliding_window;
  return windowed_layers.at(static_cast<size_t>(layer)) ? sliding_window : 0;
}

std::string ModelConfig::summary() const {
  std::string scaling;
  if (rope.type != RopeType::kDefault) scaling = fmt::format(", factor={}", rope.factor);
  if (rope.type == RopeType::kYarn) scaling += fmt::format(", attention_factor={}", rope.attention_factor);
  std::string windowed;
  if (!windowed_layers.empty())
    windowed = fmt::format(" (on {} of {} layers)", std::count(windowed_layers.begin(), windowed_layers.end(), true),
                           num_layers);
  return fmt::format(
      "{} hidden={} intermediate={} layers={} heads={} kv_heads={} head_dim={} vocab={} "
      "max_pos={} sliding_window={}{} eps={} rope={}(theta={}{}) tied={} qkv_bias={} o_bias={} qk_norm={} dtype={}",
      arch_name(arch), hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
      vocab_size, max_position_embeddings, sliding_window, windowed, rms_norm_eps, rope_type_name(rope.type), rope.theta,
      scaling, tie_word_embeddings, qkv_bias, o_bias, qk_norm, dtype_name(dtype));
}

ModelConfig load_model_config(const std::filesystem::path& model_dir) {
  require_model_folder(model_dir);
  auto config_path = model_dir / "config.json";
  // path_present, not exists(): a link that loops is read (and named) below, not thrown as a filesystem_error.
  LS_REQUIRE(path_present(config_path), ErrorKind::kIo, "missing {}", config_path.string());
  ModelConfig c = parse_model_config(read_json_file(config_path));
  auto gen_path = model_dir / "generation_config.json";
  if (path_present(gen_path)) {
    try {
      json g = read_json_file(gen_path);
      if (!g.is_object()) config_error(fmt::format("expected a JSON object, got {}", g.type_name()));
      if (g.contains("eos_token_id")) {
        c.eos_token_ids = parse_token_ids(g["eos_token_id"], "eos_token_id");
        c.validate();
      }
    } catch (const Error& e) {  // config_error's messages name config.json: name this file instead
      std::string what = e.what();
      if (what.starts_with("config.json: ")) what.erase(0, std::string("config.json: ").size());
      LS_FAIL(e.kind(), "generation_config.json: {}", what);
    }
  }
  return c;
}

namespace {

// llama3: frequencies with wavelengths past original / low_freq_factor
// divided by the factor, those under original / high_freq_factor kept, and a
// smooth blend between.
double llama3_inv_freq(const RopeConfig& rope, double inv) {
  const double original = static_cast<double>(rope.original_max_position);
  const double wavelen = 2.0 * std::numbers::pi / inv;
  if (wavelen > original / rope.low_freq_factor) return inv / rope.factor;
  if (wavelen < original / rope.high_freq_factor) return inv;
  const double smooth = (original / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
  return (1.0 - smooth) * inv / rope.factor + smooth * inv;
}

// yarn: pair i keeps its frequency below the correction range of dimensions
// [low, high] (those rotating more than beta_fast times over the original
// length), takes frequency / factor above it, and a linear ramp between.
double yarn_inv_freq(const RopeConfig& rope, int64_t i, int64_t head_dim, double inv) {
  const double dim = static_cast<double>(head_dim);
  const auto correction_dim = [&](double rotations) {
    return dim * std::log(static_cast<double>(rope.original_max_position) / (rotations * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(rope.theta));
  };
  double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
  if (rope.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;
  const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
  return inv / rope.factor * ramp + inv * (1.0 - ramp);
}

}  // namespace

const char* rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault: return "default";
    case RopeType::kLinear: return "linear";
    case RopeType::kDynamic: return "dynamic";
    case RopeType::kLlama3: return "llama3";
    case RopeType::kYarn: return "yarn";
  }
  return "?";
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim) {
  std::vector<float> out(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double inv = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    double scaled = inv;
    switch (rope.type) {
      case RopeType::kDefault:
      case RopeType::kDynamic: break;
      case RopeType::kLinear: scaled = inv / rope.factor; break;
      case RopeType::kLlama3: scaled = llama3_inv_freq(rope, inv); break;
      case RopeType::kYarn: scaled = yarn_inv_freq(rope, i, head_dim, inv); break;
    }
    out[static_cast<size_t>(i)] = static_cast<float>(scaled);
  }
  return out;
}

}  // namespace lockstep
