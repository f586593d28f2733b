// The model's configuration, read from a Hugging Face config.json (classic
// keys and transformers-5 keys) and validated in one place.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/dtype.h"

namespace lockstep {

enum class Arch { kLlama, kMistral, kQwen2, kQwen3 };
const char* arch_name(Arch a);                 // "llama", ...
const char* arch_hf_class(Arch a);             // "LlamaForCausalLM", ...
Arch parse_arch_short_name(const std::string& s);  // "llama" -> kLlama; throws otherwise

// RoPE frequency schemes as transformers names them ("rope_type"). Dynamic
// NTK scaling changes the frequencies only for positions past
// max_position_embeddings, which the KV cache never reaches (see
// ModelConfig::max_positions), so it runs as the default frequencies.
enum class RopeType { kDefault, kLinear, kDynamic, kLlama3, kYarn };
const char* rope_type_name(RopeType t);  // "default", "linear", ...

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  double factor = 1.0;  // linear, dynamic, llama3, yarn
  // llama3
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;  // llama3, yarn
  // yarn: the ramp between interpolated and original frequencies, and the
  // factor multiplying cos and sin (transformers' attention_factor; 1 for
  // every other type).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double attention_factor = 1.0;
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  // Sliding-window attention: the window (0: none) and the layers that take
  // it (windowed_layers[l]; every layer when empty and the window is set).
  int64_t sliding_window = 0;
  std::vector<bool> windowed_layers;
  double rms_norm_eps = 0.0;
  RopeConfig rope;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2, or attention_bias = true
  bool o_bias = false;    // attention_bias = true outside Qwen2
  bool qk_norm = false;   // Qwen3
  DType dtype = DType::kBF16;  // the checkpoint's declared dtype
  std::vector<int32_t> eos_token_ids;  // from config.json / generation_config.json
  int32_t bos_token_id = -1;

  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // The keys a token of `layer` attends to, its own included (0: every
  // earlier position).
  int64_t attention_window(int64_t layer) const;
  // Positions a sequence may reach: max_position_embeddings.
  int64_t max_positions() const { return max_position_embeddings; }
  // Throws kModel naming the field when something is out of range.
  void validate() const;
  std::string summary() const;  // one line for the start-up log
};

// Parses config.json content. Throws kModel with a message naming the field
// or the unsupported value (architecture, rope type, activation).
ModelConfig parse_model_config(const nlohmann::json& j);
// Reads <dir>/config.json and, when present, <dir>/generation_config.json (eos ids).
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// Inverse frequencies of RoPE (head_dim / 2 values), with the type's scaling applied.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

}  // namespace lockstep
