#include "engine/weights.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <unordered_set>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace lockstep {

namespace {

std::string layer_name(int64_t layer, const char* suffix) {
  return fmt::format("model.layers.{}.{}", layer, suffix);
}

void expect_shape(const TensorStore& store, const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo& t = store.info(name);
  LS_REQUIRE(t.shape == shape, ErrorKind::kModel, "tensor '{}' has shape [{}], the config implies [{}]",
             name, fmt::join(t.shape, ", "), fmt::join(shape, ", "));
}

class WeightReader {
 public:
  WeightReader(const TensorStore& store, const ModelConfig& config, const ShardPlan& plan, Communicator& comm,
               Backend& backend, LoadStats* stats)
      : store_(store), config_(config), plan_(plan), comm_(comm), backend_(backend), stats_(stats) {}

  // Rows [begin, begin + count) of several tensors, concatenated.
  struct RowSlice {
    std::string name;
    int64_t begin;
    int64_t count;
  };
  // With column_scale ([cols]), each row is multiplied by it element-wise
  // and rounded back to dtype: an RMSNorm weight folded into the product
  // that follows the norm (Backend::folds_input_norms).
  Buffer rows(const std::vector<RowSlice>& slices, int64_t cols, DType dtype,
              const std::vector<float>* column_scale = nullptr) {
    int64_t total = 0;
    for (const auto& s : slices) total += s.count;
    const auto row_bytes = cols * static_cast<int64_t>(dtype_size(dtype));
    Target t = target(total * row_bytes);
    int64_t at = 0;
    for (const auto& s : slices) {
      read_sharded(s.name, s.begin, s.begin + s.count, 0, cols, dtype, t.host + at * row_bytes);
      at += s.count;
    }
    if (column_scale != nullptr) scale_columns(t.host, total, cols, dtype, *column_scale);
    return finish(std::move(t));
  }

  // A buffer of `numel` elements of `dtype` in backend memory, as float32 on the host.
  std::vector<float> host_floats(const Buffer& buf, int64_t numel, DType dtype) {
    std::vector<uint8_t> raw(static_cast<size_t>(numel) * dtype_size(dtype));
    backend_.to_host(raw.data(), buf.data(), static_cast<int64_t>(raw.size()));
    std::vector<float> out(static_cast<size_t>(numel));
    convert_to_f32(raw.data(), dtype, out.data(), out.size());
    return out;
  }

  DType weight_dtype() const { return backend_.weight_dtype(); }
  bool folds_input_norms() const { return backend_.folds_input_norms(); }

  // Columns [begin, begin + count) of a [rows, cols] tensor.
  Buffer cols(const std::string& name, int64_t rows, int64_t begin, int64_t count) {
    Target t = target(rows * count * static_cast<int64_t>(dtype_size(weight_dtype())));
    read_sharded(name, 0, rows, begin, begin + count, weight_dtype(), t.host);
    return finish(std::move(t));
  }

  // Vocab-parallel table: this rank's rows, padding rows left zero.
  Buffer vocab_rows(const std::string& name, DType dtype) {
    const auto row_bytes = config_.hidden_size * static_cast<int64_t>(dtype_size(dtype));
    Target t = target(plan_.vocab_local * row_bytes);
    const int64_t real = plan_.vocab_real_local();
    if (real > 0)
      read_sharded(name, plan_.vocab_begin, plan_.vocab_begin + real, 0, config_.hidden_size, dtype, t.host);
    std::memset(t.host + real * row_bytes, 0, static_cast<size_t>((plan_.vocab_local - real) * row_bytes));
    return finish(std::move(t));
  }

  // Read by rank 0 and broadcast from its backend memory into the others'
  // (on GPUs: NCCL into device memory); what each rank then holds is folded
  // into the replicated checksum that all ranks compare.
  Buffer replicated(const std::string& name, int64_t numel, DType dtype) {
    Target t = target(numel * static_cast<int64_t>(dtype_size(dtype)));
    if (comm_.rank() == 0) {
      uint64_t before = store_.bytes_read();
      store_.read_block(name, 0, numel, 0, 1, dtype, t.host);
      stats_->replicated_bytes_read += store_.bytes_read() - before;
    } else {
      std::memset(t.host, 0, static_cast<size_t>(t.buf.bytes()));
    }
    Buffer buf = finish(std::move(t));
    comm_.broadcast(buf.data(), buf.bytes(), 0);
    std::vector<uint8_t> held(static_cast<size_t>(buf.bytes()));
    backend_.to_host(held.data(), buf.data(), buf.bytes());
    stats_->replicated_checksum = fnv1a(stats_->replicated_checksum, held.data(), held.size());  // in load order
    return buf;
  }

 private:
  static void scale_columns(uint8_t* host, int64_t rows, int64_t cols, DType dtype, const std::vector<float>& scale) {
    LS_REQUIRE(static_cast<int64_t>(scale.size()) == cols, ErrorKind::kInternal, "column scale of {} for {} columns",
               scale.size(), cols);
    const auto row_bytes = cols * static_cast<int64_t>(dtype_size(dtype));
#pragma omp parallel
    {
      std::vector<float> row(static_cast<size_t>(cols));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        uint8_t* at = host + r * row_bytes;
        convert_to_f32(at, dtype, row.data(), row.size());
        for (int64_t c = 0; c < cols; ++c) row[static_cast<size_t>(c)] *= scale[static_cast<size_t>(c)];
        convert_from_f32(row.data(), at, dtype, row.size());
      }
    }
  }

  void read_sharded(const std::string& name, int64_t r0, int64_t r1, int64_t c0, int64_t c1, DType dtype,
                    void* dst) {
    uint64_t before = store_.bytes_read();
    store_.read_block(name, r0, r1, c0, c1, dtype, dst);
    stats_->sharded_bytes_read += store_.bytes_read() - before;
  }

  // Where a tensor share is assembled, in the dtype the backend keeps (16-bit
  // weights are copied, not converted to float32 and back): the backend's
  // buffer itself when it is host memory, else one staging buffer for the
  // whole load, whose pages are touched once rather than once per tensor
  // (fresh pages cost the kernel a clear each, which dominated the load).
  struct Target {
    Buffer buf;
    uint8_t* host;
  };
  Target target(int64_t bytes) {
    Buffer buf = backend_.alloc_weights(bytes);
    auto* host = static_cast<uint8_t*>(buf.data());
    if (!backend_.host_memory()) {
      // At least one byte: an empty share still gets a pointer (memset, copies of 0 bytes).
      if (static_cast<int64_t>(staging_.size()) < std::max<int64_t>(bytes, 1))
        staging_.resize(static_cast<size_t>(std::max<int64_t>(bytes, 1)));
      host = staging_.data();
    }
    return {std::move(buf), host};
  }
  Buffer finish(Target t) {
    if (!backend_.host_memory()) backend_.to_backend(t.buf.data(), t.host, t.buf.bytes());
    return std::move(t.buf);
  }

  const TensorStore& store_;
  const ModelConfig& config_;
  const ShardPlan& plan_;
  Communicator& comm_;
  Backend& backend_;
  LoadStats* stats_;
  std::vector<uint8_t> staging_;
};

LayerWeights load_layer(WeightReader& r, const ModelConfig& c, const ShardPlan& p, int64_t l, DType act) {
  const int64_t hd = c.head_dim;
  const int64_t hidden = c.hidden_size;
  LayerWeights w;
  w.input_norm = r.replicated(layer_name(l, "input_layernorm.weight"), hidden, act);
  w.post_attn_norm = r.replicated(layer_name(l, "post_attention_layernorm.weight"), hidden, act);
  if (c.qk_norm) {
    w.q_norm = r.replicated(layer_name(l, "self_attn.q_norm.weight"), hd, act);
    w.k_norm = r.replicated(layer_name(l, "self_attn.k_norm.weight"), hd, act);
  }
  auto qkv_slices = [&](const char* suffix) {
    return std::vector<WeightReader::RowSlice>{
        {layer_name(l, fmt::format("self_attn.q_proj.{}", suffix).c_str()), p.q_head_begin * hd, p.q_heads_local * hd},
        {layer_name(l, fmt::format("self_attn.k_proj.{}", suffix).c_str()), p.kv_head_begin * hd, p.kv_heads_local * hd},
        {layer_name(l, fmt::format("self_attn.v_proj.{}", suffix).c_str()), p.kv_head_begin * hd, p.kv_heads_local * hd}};
  };
  // Where the backend folds the norms, their weights go into the products that read the normed rows.
  std::vector<float> input_g, post_attn_g;
  if (r.folds_input_norms()) {
    input_g = r.host_floats(w.input_norm, hidden, act);
    post_attn_g = r.host_floats(w.post_attn_norm, hidden, act);
  }
  w.qkv = r.rows(qkv_slices("weight"), hidden, r.weight_dtype(), input_g.empty() ? nullptr : &input_g);
  if (c.qkv_bias) w.qkv_bias = r.rows(qkv_slices("bias"), 1, act);
  w.o_proj = r.cols(layer_name(l, "self_attn.o_proj.weight"), hidden, p.q_head_begin * hd, p.q_heads_local * hd);
  if (c.o_bias) w.o_bias = r.replicated(layer_name(l, "self_attn.o_proj.bias"), hidden, act);
  w.gate_up = r.rows({{layer_name(l, "mlp.gate_proj.weight"), p.inter_begin, p.inter_local},
                      {layer_name(l, "mlp.up_proj.weight"), p.inter_begin, p.inter_local}},
                     hidden, r.weight_dtype(), post_attn_g.empty() ? nullptr : &post_attn_g);
  w.down = r.cols(layer_name(l, "mlp.down_proj.weight"), hidden, p.inter_begin, p.inter_local);
  return w;
}

// Bytes of every tensor that is split across ranks.
uint64_t sharded_checkpoint_bytes(const TensorStore& store, const ModelConfig& c) {
  uint64_t total = store.info("model.embed_tokens.weight").nbytes();
  if (!c.tie_word_embeddings) total += store.info("lm_head.weight").nbytes();
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const char* s : {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                          "mlp.down_proj.weight"})
      total += store.info(layer_name(l, s)).nbytes();
  if (c.qkv_bias)
    for (int64_t l = 0; l < c.num_layers; ++l)
      for (const char* s : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"})
        total += store.info(layer_name(l, s)).nbytes();
  return total;
}

}  // namespace

namespace {

// The tensors a checkpoint of config c holds, with the shapes c implies.
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_tensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> t{{"model.embed_tokens.weight", {c.vocab_size, h}},
                                                              {"model.norm.weight", {h}}};
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const auto add = [&](const char* suffix, std::vector<int64_t> shape) {
      t.emplace_back(layer_name(l, suffix), std::move(shape));
    };
    add("input_layernorm.weight", {h});
    add("post_attention_layernorm.weight", {h});
    add("self_attn.q_proj.weight", {c.q_dim(), h});
    add("self_attn.k_proj.weight", {c.kv_dim(), h});
    add("self_attn.v_proj.weight", {c.kv_dim(), h});
    add("self_attn.o_proj.weight", {h, c.q_dim()});
    if (c.qkv_bias) {
      add("self_attn.q_proj.bias", {c.q_dim()});
      add("self_attn.k_proj.bias", {c.kv_dim()});
      add("self_attn.v_proj.bias", {c.kv_dim()});
    }
    if (c.o_bias) add("self_attn.o_proj.bias", {h});
    if (c.qk_norm) {
      add("self_attn.q_norm.weight", {c.head_dim});
      add("self_attn.k_norm.weight", {c.head_dim});
    }
    add("mlp.gate_proj.weight", {c.intermediate_size, h});
    add("mlp.up_proj.weight", {c.intermediate_size, h});
    add("mlp.down_proj.weight", {h, c.intermediate_size});
  }
  return t;
}

// The layer a "model.layers.N.*" name belongs to, else -1.
int64_t layer_of(const std::string& name) {
  constexpr std::string_view kPrefix = "model.layers.";
  if (!name.starts_with(kPrefix)) return -1;
  int64_t layer = 0;
  size_t i = kPrefix.size();
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && layer < (int64_t{1} << 40); ++i)
    layer = layer * 10 + (name[i] - '0');
  return i > kPrefix.size() && i < name.size() && name[i] == '.' ? layer : -1;
}

}  // namespace

void check_checkpoint_shapes(const TensorStore& store, const ModelConfig& c) {
  for (const auto& [name, shape] : expected_tensors(c)) expect_shape(store, name, shape);
}

// Tensors the config leaves unread (layers past num_hidden_layers, as when a
// config is cut down to a quick truncated model; an old rotary table; a bias
// the config turns off; an LM head beside tied embeddings) are left out as
// transformers leaves them, with a warning that names the layers.
void warn_unread_tensors(const TensorStore& store, const ModelConfig& c) {
  std::unordered_set<std::string> used;
  for (const auto& e : expected_tensors(c)) used.insert(e.first);
  std::vector<std::string> unread;
  int64_t last_layer = -1;
  for (const std::string& name : store.names()) {
    last_layer = std::max(last_layer, layer_of(name));
    if (!used.contains(name)) unread.push_back(name);
  }
  if (last_layer >= c.num_layers)
    spdlog::warn("the checkpoint holds layers {}-{}, past config.json's num_hidden_layers {}: they are not used",
                 c.num_layers, last_layer, c.num_layers);
  if (std::find(unread.begin(), unread.end(), "lm_head.weight") != unread.end())
    spdlog::warn("tie_word_embeddings is true: lm_head.weight in the checkpoint is not used (the LM head is the "
                 "embedding table, as in transformers)");
  if (!unread.empty())
    spdlog::warn("{} checkpoint tensor(s) not used by this config, e.g. {}", unread.size(),
                 fmt::join(unread.begin(), unread.begin() + std::min<size_t>(unread.size(), 3), ", "));
}

int64_t ModelWeights::bytes() const {
  int64_t total = embed.bytes() + lm_head.bytes() + final_norm.bytes();
  for (const LayerWeights& l : layers)
    for (const Buffer* b : {&l.input_norm, &l.post_attn_norm, &l.q_norm, &l.k_norm, &l.qkv, &l.qkv_bias, &l.o_proj,
                            &l.o_bias, &l.gate_up, &l.down})
      total += b->bytes();
  return total;
}

// Mirrors load_layer and load_weights' allocations (Tp.WeightBytesMatchWhatLoads checks it).
int64_t weight_bytes(const ModelConfig& c, const ShardPlan& p, DType weight, DType act) {
  const auto w = static_cast<int64_t>(dtype_size(weight));
  const auto a = static_cast<int64_t>(dtype_size(act));
  const int64_t h = c.hidden_size, hd = c.head_dim;
  const int64_t qkv_rows = (p.q_heads_local + 2 * p.kv_heads_local) * hd;
  int64_t layer = 2 * h * a + qkv_rows * h * w + h * p.q_heads_local * hd * w + 3 * p.inter_local * h * w;
  if (c.qk_norm) layer += 2 * hd * a;
  if (c.qkv_bias) layer += qkv_rows * a;
  if (c.o_bias) layer += h * a;
  const int64_t table = p.vocab_local * h * w;
  return table * (c.tie_word_embeddings ? 1 : 2) + c.num_layers * layer + h * a;
}

ModelWeights load_weights(const TensorStore& store, const ModelConfig& c, const ShardPlan& p, Communicator& comm,
                          Backend& backend, LoadStats* stats) {
  LoadStats local;
  if (stats == nullptr) stats = &local;
  *stats = LoadStats{};
  stats->replicated_checksum = kFnvOffset;
  check_checkpoint_shapes(store, c);
  stats->sharded_bytes_in_checkpoint = sharded_checkpoint_bytes(store, c);
  WeightReader reader(store, c, p, comm, backend, stats);
  const DType act = backend.act_dtype();
  ModelWeights w;
  // The table in the products' weight dtype, as the LM head (a tied one is
  // the table): on the CPU a 16-bit table, whose rows the embedding op widens.
  w.embed = reader.vocab_rows("model.embed_tokens.weight", backend.weight_dtype());
  if (!c.tie_word_embeddings) w.lm_head = reader.vocab_rows("lm_head.weight", backend.weight_dtype());
  for (int64_t l = 0; l < c.num_layers; ++l) w.layers.push_back(load_layer(reader, c, p, l, act));
  w.final_norm = reader.replicated("model.norm.weight", c.hidden_size, act);
  return w;
}

}  // namespace lockstep
