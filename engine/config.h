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

enum class RopeType { kDefault, kLlama3 };

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // llama3 scaling
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
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
  // Throws kModel naming the field when something is out of range.
  void validate() const;
  std::string summary() const;  // one line for the start-up log
};

// Parses config.json content. Throws kModel with a message naming the field
// or the unsupported value (architecture, rope type, activation, sliding window).
ModelConfig parse_model_config(const nlohmann::json& j);
// Reads <dir>/config.json and, when present, <dir>/generation_config.json (eos ids).
ModelConfig load_model_config(const std::filesystem::path& model_dir);

// Inverse frequencies of RoPE (head_dim / 2 values), with llama3 scaling applied.
std::vector<float> rope_inv_freq(const RopeConfig& rope, int64_t head_dim);

}  // namespace lockstep
