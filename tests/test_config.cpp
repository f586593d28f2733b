#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "engine/config.h"
#include "test_support.h"
#include "tp/sharding.h"

namespace lockstep {
namespace {

using nlohmann::json;

json llama_classic() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    "torch_dtype": "bfloat16", "hidden_act": "silu", "eos_token_id": [2, 3], "tie_word_embeddings": true})");
}

TEST(Config, ClassicKeys) {
  ModelConfig c = parse_model_config(llama_classic());
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_EQ(c.rope.original_max_position, 8192);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
}

TEST(Config, Transformers5Keys) {
  json j = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "vocab_size": 384, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "dtype": "float16", "sliding_window": 4096, "use_sliding_window": false, "eos_token_id": 5})");
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.arch, Arch::kQwen3);
  EXPECT_EQ(c.head_dim, 32);  // explicit, not hidden / heads
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1000000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.dtype, DType::kF16);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{5}));
}

TEST(Config, Qwen2HasQkvBiasOnly) {
  json j = llama_classic();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["rope_scaling"] = nullptr;
  ModelConfig c = parse_model_config(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
}

TEST(Config, AttentionBiasAddsOprojBias) {
  json j = llama_classic();
  j["attention_bias"] = true;
  ModelConfig c = parse_model_config(j);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
}

TEST(Config, RefusesUnsupportedThingsByName) {
  auto refuse = [](json j, std::initializer_list<std::string> words) {
    expect_error([&] { parse_model_config(j); }, ErrorKind::kModel, words);
  };
  json j = llama_classic();
  j["architectures"] = {"GPT2LMHeadModel"};
  refuse(j, {"GPT2LMHeadModel", "unsupported architecture"});
  j = llama_classic();
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  refuse(j, {"longrope", "rope"});
  j = llama_classic();
  j["rope_scaling"] = {{"type", "linear"}};
  refuse(j, {"factor", "rope_scaling"});
  j = llama_classic();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", -2.0}};
  refuse(j, {"yarn", "factor"});
  j = llama_classic();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = -1;
  refuse(j, {"sliding_window"});
  j = llama_classic();
  j["hidden_act"] = "gelu";
  refuse(j, {"gelu", "activation"});
  j = llama_classic();
  j.erase("rms_norm_eps");
  refuse(j, {"rms_norm_eps"});
  j = llama_classic();
  j["num_key_value_heads"] = 3;
  refuse(j, {"num_key_value_heads", "3"});
  j = llama_classic();
  j["hidden_size"] = "64";
  refuse(j, {"hidden_size"});
  j = llama_classic();
  j["eos_token_id"] = 384;
  refuse(j, {"eos_token_id", "384"});
  // Wrong types and ranges are named, not thrown as a JSON library error or wrapped.
  j = llama_classic();
  j["architectures"] = "LlamaForCausalLM";
  refuse(j, {"'architectures' must be a list", "\"LlamaForCausalLM\""});
  j = llama_classic();
  j["partial_rotary_factor"] = "x";
  refuse(j, {"partial_rotary_factor", "must be a number"});
  j = llama_classic();
  j["eos_token_id"] = {2, int64_t{5000000000}};
  refuse(j, {"eos_token_id", "5000000000"});
  j = llama_classic();
  j["eos_token_id"] = -1;
  refuse(j, {"eos_token_id", "-1"});
  // Integers of 2^63 or more are kept unsigned by the JSON reader: refused,
  // not wrapped to negative values (Qwen2's max_window_layers of 2^64 - 1
  // read as -1 windowed every layer).
  j = llama_classic();
  j["intermediate_size"] = uint64_t{9223372036854775808ULL};
  refuse(j, {"'intermediate_size' is too large", "9223372036854775808"});
  j = llama_classic();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["model_type"] = "qwen2";
  j["use_sliding_window"] = true;
  j["sliding_window"] = 2;
  j["max_window_layers"] = uint64_t{18446744073709551615ULL};
  refuse(j, {"'max_window_layers' is too large"});
  j = llama_classic();
  j["torch_dtype"] = "float1";
  refuse(j, {"config.json", "'torch_dtype'", "float1"});
}

// bos_token_id is informational (the tokenizer adds the BOS): a value that is
// not an id is left out rather than refused.
TEST(Config, BosTokenIdIsInformational) {
  json j = llama_classic();
  j["bos_token_id"] = -1;
  EXPECT_EQ(parse_model_config(j).bos_token_id, -1);
  j["bos_token_id"] = {7};
  EXPECT_EQ(parse_model_config(j).bos_token_id, 7);
}

// Sliding windows as transformers applies them: the window and the layers
// that take it. A windowed model still reaches max_position_embeddings.
TEST(Config, SlidingWindowAsTransformersAppliesIt) {
  const auto window = [](json j) { return parse_model_config(j).sliding_window; };
  // The window of each of the two layers.
  const auto layers = [](json j) {
    const ModelConfig c = parse_model_config(j);
    return std::vector<int64_t>{c.attention_window(0), c.attention_window(1)};
  };
  json j = llama_classic();
  j["max_position_embeddings"] = 32768;
  j["sliding_window"] = 4096;
  EXPECT_EQ(window(j), 0);  // Llama has no sliding window
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_EQ(window(j), 4096);
  EXPECT_EQ(layers(j), (std::vector<int64_t>{4096, 4096}));  // every layer
  EXPECT_EQ(parse_model_config(j).max_positions(), 32768);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(window(j), 0);
  EXPECT_EQ(layers(j), (std::vector<int64_t>{0, 0}));
  j.erase("sliding_window");
  EXPECT_EQ(window(j), 4096);  // MistralConfig's default
  j = llama_classic();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["rope_scaling"] = nullptr;
  j["sliding_window"] = 128;
  EXPECT_EQ(window(j), 0);  // use_sliding_window is false by default
  j["use_sliding_window"] = true;
  EXPECT_EQ(window(j), 0);  // windows layers from max_window_layers (28 by default) on: none of 2
  j["max_window_layers"] = 1;
  EXPECT_EQ(window(j), 128);
  EXPECT_EQ(layers(j), (std::vector<int64_t>{0, 128}));
  j["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(window(j), 0);  // named layers win
  j["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_EQ(layers(j), (std::vector<int64_t>{128, 0}));
  j["use_sliding_window"] = false;
  EXPECT_EQ(layers(j), (std::vector<int64_t>{0, 0}));  // the flag gates the layer types
  j["use_sliding_window"] = true;
  const auto refuse = [](json j, std::initializer_list<std::string> words) {
    expect_error([&] { parse_model_config(j); }, ErrorKind::kModel, words);
  };
  j["layer_types"] = {"sliding_attention"};
  refuse(j, {"layer_types", "2"});
  j["layer_types"] = {"sliding_attention", "chunked_attention"};
  refuse(j, {"layer_types", "chunked_attention"});
}

TEST(Config, RopeTypesFollowTransformersDefaults) {
  json j = llama_classic();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};  // the pre-rope_type key
  ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.rope.type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 1.0);
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(parse_model_config(j).rope.type, RopeType::kDynamic);
  // YaRN as Qwen3 publishes it: factor 4, 32768 original positions, and an
  // attention factor of 0.1·ln(4) + 1.
  j["max_position_embeddings"] = 131072;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  c = parse_model_config(j);
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 4.0);
  EXPECT_EQ(c.rope.original_max_position, 32768);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, 0.1 * std::log(4.0) + 1.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(c.rope.beta_slow, 1.0);
  EXPECT_TRUE(c.rope.truncate);
  // No factor: the ratio of the position counts; mscale over mscale_all_dim;
  // a top-level original_max_position_embeddings wins.
  j["original_max_position_embeddings"] = 16384;
  j["rope_scaling"] = {{"rope_type", "yarn"},          {"original_max_position_embeddings", 32768},
                       {"mscale", 0.5},                {"mscale_all_dim", 2.0},
                       {"beta_fast", 0},               {"truncate", false}};
  c = parse_model_config(j);
  EXPECT_EQ(c.rope.original_max_position, 16384);
  EXPECT_DOUBLE_EQ(c.rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope.attention_factor, (0.05 * std::log(8.0) + 1.0) / (0.2 * std::log(8.0) + 1.0));
  EXPECT_DOUBLE_EQ(c.rope.beta_fast, 32.0);  // 0 means the default, as `or 32` does
  EXPECT_FALSE(c.rope.truncate);
  j["rope_scaling"]["attention_factor"] = 1.5;
  EXPECT_DOUBLE_EQ(parse_model_config(j).rope.attention_factor, 1.5);
}

TEST(Sharding, SplitsHeadsIntermediateAndPaddedVocab) {
  ModelConfig c = parse_model_config(llama_classic());  // 4 heads, 2 kv heads, inter 96, vocab 384
  ShardPlan p = ShardPlan::make(c, 1, 2);
  EXPECT_EQ(p.q_heads_local, 2);
  EXPECT_EQ(p.q_head_begin, 2);
  EXPECT_EQ(p.kv_heads_local, 1);
  EXPECT_EQ(p.kv_head_begin, 1);
  EXPECT_EQ(p.inter_local, 48);
  EXPECT_EQ(p.inter_begin, 48);
  c.vocab_size = 383;  // not a multiple of 2: padded
  p = ShardPlan::make(c, 1, 2);
  EXPECT_EQ(p.vocab_padded, 384);
  EXPECT_EQ(p.vocab_local, 192);
  EXPECT_EQ(p.vocab_real_local(), 191);
}

TEST(Sharding, ReplicatesKvHeadsWhenTpExceedsThem) {
  ModelConfig c = parse_model_config(llama_classic());  // 2 kv heads, 4 q heads
  for (int r = 0; r < 4; ++r) {
    ShardPlan p = ShardPlan::make(c, r, 4);
    EXPECT_EQ(p.q_heads_local, 1);
    EXPECT_EQ(p.kv_heads_local, 1);
    // q head r uses kv head r / (4 / 2): the replicated head must match GQA's mapping.
    EXPECT_EQ(p.kv_head_begin, p.q_head_begin / (c.num_heads / c.num_kv_heads));
  }
}

TEST(Sharding, RefusesSizesThatDoNotDivide) {
  ModelConfig c = parse_model_config(llama_classic());
  expect_error([&] { ShardPlan::make(c, 0, 3); }, ErrorKind::kInvalidArgument, {"3", "num_attention_heads", "4"});
  c.num_heads = 8;
  c.intermediate_size = 90;
  expect_error([&] { ShardPlan::make(c, 0, 4); }, ErrorKind::kInvalidArgument, {"intermediate_size", "90"});
}

}  // namespace
}  // namespace lockstep
