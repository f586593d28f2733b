// Writes a random-weight model in the Hugging Face layout (config.json,
// generation_config.json, model.safetensors or shards with their index),
// streaming tensor data so that a 70B-shaped model needs little memory.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "engine/config.h"
#include "engine/io/safetensors.h"

namespace lockstep {

enum class ConfigStyle { kClassic, kTransformers5 };  // rope_theta/torch_dtype vs rope_parameters/dtype

struct MakeModelOptions {
  ModelConfig shape;  // arch and every shape field; eos/bos filled in by the writer
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  std::filesystem::path out;
  int64_t max_shard_bytes = 5'000'000'000;  // the Hugging Face default shard size
  ConfigStyle style = ConfigStyle::kClassic;
  bool write_tokenizer = true;  // a small byte-level BPE tokenizer.json
  void validate() const;
};

// The preset's shape for an architecture: tiny, small (~100M parameters),
// llama3-8b, llama3-70b, qwen3-8b. Throws kInvalidArgument on an unknown name.
ModelConfig model_preset(const std::string& preset, Arch arch);

void write_random_model(const MakeModelOptions& options);

// The model write_random_model would write, in memory: its config (as
// parsed back from its config.json) and its tensors, generated as they are
// read with the same values (`bench --preset`: no checkpoint on disk).
struct RandomModel {
  ModelConfig config;
  std::vector<GeneratedTensor> tensors;
};
RandomModel random_model(const ModelConfig& shape, DType dtype, uint64_t seed);

}  // namespace lockstep
