#include "engine/runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <spdlog/spdlog.h>

#include "common/error.h"

namespace lockstep {

namespace {

Buffer alloc_elems(Backend& b, int64_t count, DType t) {
  return b.alloc(count * static_cast<int64_t>(dtype_size(t)));
}

// Columns per argmax candidate: a 128k vocabulary is read by 32 blocks a row
// on the GPU, and its candidates stay a few hundred bytes a row.
constexpr int64_t kArgmaxSplitCols = 4096;

}  // namespace

Runner::Runner(const ModelConfig& config, const ShardPlan& plan, ModelWeights weights, Backend& backend,
               RunnerLimits limits, Diagnostics diag)
    : config_(config),
      plan_(plan),
      weights_(std::move(weights)),
      backend_(backend),
      limits_(limits),
      diag_(diag),
      act_(backend.act_dtype()),
      fold_norms_(backend.folds_input_norms()) {
  limits_.validate();
  const int64_t T = limits_.max_step_tokens;
  const int64_t hd = config_.head_dim;
  inv_freq_host_ = rope_inv_freq(config_.rope, hd);
  inv_freq_ = backend_.upload(inv_freq_host_, DType::kF32);
  const KvCacheShape cs = cache_shape();
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    k_cache_.push_back(alloc_elems(backend_, cs.num_slots * cs.slot_stride(), act_));
    v_cache_.push_back(alloc_elems(backend_, cs.num_slots * cs.slot_stride(), act_));
  }
  static_assert(sizeof(SampleRow) % 8 == 0 && alignof(SampleRow) == 8);
  constexpr int64_t kSampleRowElems = sizeof(SampleRow) / 4;
  batch_arrays_ = alloc_elems(backend_, (3 * T + limits_.max_logit_rows + 1) / 2 * 2 +
                                            kSampleRowElems * limits_.max_logit_rows,
                              DType::kF32);  // 4-byte elements
  argmax_splits_ = (plan_.vocab_local + kArgmaxSplitCols - 1) / kArgmaxSplitCols;
  argmax_ = alloc_elems(backend_, 2 * limits_.max_logit_rows * argmax_splits_, DType::kF32);
  sampled_ = alloc_elems(backend_, limits_.max_logit_rows, DType::kF32);  // int32 ids
  argmax_gathered_ = alloc_elems(backend_, plan_.size * 2 * limits_.max_logit_rows * argmax_splits_, DType::kF32);
  published_ = backend_.alloc_host_visible(2 * limits_.max_logit_rows * 4);
  published_count_ = alloc_elems(backend_, 1, DType::kF32);
  const uint32_t zero = 0;
  backend_.to_backend(published_count_.data(), &zero, 4);
  const int64_t hidden = config_.hidden_size;
  for (Buffer& r : residual_) r = alloc_elems(backend_, T * hidden, act_);
  normed_ = alloc_elems(backend_, T * hidden, act_);
  qkv_ = alloc_elems(backend_, T * (plan_.q_heads_local + 2 * plan_.kv_heads_local) * hd, act_);
  attn_ = alloc_elems(backend_, T * plan_.q_heads_local * hd, act_);
  partial_ = alloc_elems(backend_, T * hidden, act_);
  layer_out_ = &partial_;
  gate_up_ = alloc_elems(backend_, T * 2 * plan_.inter_local, act_);
  act_buf_ = alloc_elems(backend_, T * plan_.inter_local, act_);
  lm_partial_ = alloc_elems(backend_, limits_.max_logit_rows * hidden, act_);
  lm_residual_ = alloc_elems(backend_, limits_.max_logit_rows * hidden, act_);
  logits_ = alloc_elems(backend_, limits_.max_logit_rows * plan_.vocab_local, act_);
  logits_gathered_ = alloc_elems(backend_, plan_.size * limits_.max_logit_rows * plan_.vocab_local, act_);
}

KvCacheShape Runner::cache_shape() const {
  return KvCacheShape{.num_slots = limits_.max_slots + (has_padding_slot() ? 1 : 0),
                      .max_seq = limits_.max_seq,
                      .num_kv_heads = plan_.kv_heads_local,
                      .head_dim = config_.head_dim,
                      .head_major = backend_.kv_cache_head_major()};
}

void Runner::set_batch(const BatchDesc& b) {
  const int64_t n = b.size();
  LS_REQUIRE(n > 0, ErrorKind::kInvalidArgument, "empty batch");
  LS_REQUIRE(static_cast<int64_t>(b.slots.size()) == n && static_cast<int64_t>(b.positions.size()) == n,
             ErrorKind::kInternal, "batch arrays differ in length");
  LS_REQUIRE(n <= limits_.max_step_tokens, ErrorKind::kInvalidArgument,
             "batch of {} tokens exceeds the step limit of {}", n, limits_.max_step_tokens);
  LS_REQUIRE(static_cast<int64_t>(b.logit_rows.size()) <= limits_.max_logit_rows, ErrorKind::kInvalidArgument,
             "{} logit rows exceed the limit of {}", b.logit_rows.size(), limits_.max_logit_rows);
  for (int64_t i = 0; i < n; ++i) {
    LS_REQUIRE(b.tokens[i] >= 0 && b.tokens[i] < config_.vocab_size, ErrorKind::kInvalidArgument,
               "token id {} is outside the vocabulary [0, {})", b.tokens[i], config_.vocab_size);
    LS_REQUIRE(b.slots[i] >= 0 && b.slots[i] < cache_shape().num_slots, ErrorKind::kInvalidArgument,
               "sequence slot {} outside [0, {})", b.slots[i], cache_shape().num_slots);
    LS_REQUIRE(b.positions[i] >= 0 && b.positions[i] < limits_.max_seq, ErrorKind::kInvalidArgument,
               "position {} is beyond the context length {}", b.positions[i], limits_.max_seq);
  }
  for (int32_t r : b.logit_rows)
    LS_REQUIRE(r >= 0 && r < n, ErrorKind::kInternal, "logit row {} outside the batch", r);
  LS_REQUIRE(b.sample_rows.empty() || b.sample_rows.size() == b.logit_rows.size(), ErrorKind::kInternal,
             "{} sampling settings for {} logit rows", b.sample_rows.size(), b.logit_rows.size());
  for (const SampleRow& s : b.sample_rows) s.validate();
  // The arrays lie back to back at offsets that depend on the batch size
  // only (a bucket's graph keeps its addresses): one copy of a few bytes
  // uploads a decode step's batch.
  const auto rows = static_cast<int64_t>(b.logit_rows.size());
  batch_samples_ = !b.sample_rows.empty();
  const int64_t sample_offset = (3 * n + rows + 1) / 2 * 2;  // 8-byte aligned
  const int64_t sample_bytes = batch_samples_ ? rows * static_cast<int64_t>(sizeof(SampleRow)) : 0;
  ids_ = batch_arrays_.as<int32_t>();
  slots_ = ids_ + n;
  positions_ = slots_ + n;
  logit_rows_buf_ = positions_ + n;
  sample_rows_ = reinterpret_cast<SampleRow*>(ids_ + sample_offset);
  batch_host_.resize(static_cast<size_t>(batch_samples_ ? sample_offset + sample_bytes / 4 : 3 * n + rows));
  std::copy(b.tokens.begin(), b.tokens.end(), batch_host_.begin());
  std::copy(b.slots.begin(), b.slots.end(), batch_host_.begin() + n);
  std::copy(b.positions.begin(), b.positions.end(), batch_host_.begin() + 2 * n);
  std::copy(b.logit_rows.begin(), b.logit_rows.end(), batch_host_.begin() + 3 * n);
  if (batch_samples_)
    std::memcpy(batch_host_.data() + sample_offset, b.sample_rows.data(), static_cast<size_t>(sample_bytes));
  backend_.to_backend(ids_, batch_host_.data(), static_cast<int64_t>(batch_host_.size()) * 4);
  tokens_ = n;
  tokens_per_sequence_ = 1;
  for (int64_t i = 1, run = 1; i < n; ++i) {
    run = b.slots[i] == b.slots[i - 1] ? run + 1 : 1;
    tokens_per_sequence_ = std::max(tokens_per_sequence_, run);
  }
  // No lower writes (AttentionParams): every token holds the lowest position of its slot in the batch.
  slot_min_position_.assign(static_cast<size_t>(cache_shape().num_slots), std::numeric_limits<int32_t>::max());
  for (int64_t i = 0; i < n; ++i) {
    int32_t& lowest = slot_min_position_[static_cast<size_t>(b.slots[i])];
    lowest = std::min(lowest, b.positions[i]);
  }
  no_lower_writes_ = true;
  for (int64_t i = 0; i < n && no_lower_writes_; ++i)
    no_lower_writes_ = b.positions[i] == slot_min_position_[static_cast<size_t>(b.slots[i])];
  logit_rows_ = static_cast<int64_t>(b.logit_rows.size());
  all_rows_logits_ = logit_rows_ == n;
  for (int64_t i = 0; i < logit_rows_ && all_rows_logits_; ++i) all_rows_logits_ = b.logit_rows[i] == i;
  feeds_back_ = all_rows_logits_ && tokens_per_sequence_ == 1;
  if (diag_.shapes || diag_.attn) log_batch_diagnostics(b);
}

void Runner::copy_kv_prefix(int32_t from, int32_t to, int64_t positions) {
  const KvCacheShape cs = cache_shape();
  LS_REQUIRE(from >= 0 && from < limits_.max_slots && to >= 0 && to < limits_.max_slots && positions >= 0 &&
                 positions <= limits_.max_seq,
             ErrorKind::kInternal, "cache copy of {} positions from slot {} to slot {}", positions, from, to);
  if (from == to || positions == 0) return;
  const auto elem = static_cast<int64_t>(dtype_size(act_));
  // The first `positions` positions: one run of bytes position-major, one a kv head head-major.
  const int64_t runs = cs.head_major ? cs.num_kv_heads : 1;
  const int64_t run_bytes = positions * cs.position_stride() * elem;
  for (int64_t l = 0; l < config_.num_layers; ++l)
    for (const Buffer* cache : {&k_cache_[static_cast<size_t>(l)], &v_cache_[static_cast<size_t>(l)]}) {
      auto* base = cache->as<uint8_t>();
      for (int64_t h = 0; h < runs; ++h)
        backend_.copy_within(base + cs.offset(to, 0, h) * elem, base + cs.offset(from, 0, h) * elem, run_bytes);
    }
}

void Runner::embed() {
  backend_.embedding(EmbeddingParams{.ids = ids_,
                                     .table = weights_.embed.data(),
                                     .out = residual_[0].data(),
                                     .tokens = tokens_,
                                     .hidden = config_.hidden_size,
                                     .row_begin = plan_.vocab_begin,
                                     .rows_local = plan_.vocab_local,
                                     .dtype = act_,
                                     .table_dtype = backend_.weight_dtype()});
}

// Sub-phase k's residual stream (2·layer before attention, 2·layer + 1
// before the MLP, 2·layers before the LM head).
const Buffer& Runner::stream(int64_t k) const { return residual_[k % 2]; }

RmsNormParams Runner::input_norm(int64_t k, const Buffer& weight) const {
  RmsNormParams p{.weight = weight.data(),
                  .out = normed_.data(),
                  .rows = tokens_,
                  .cols = config_.hidden_size,
                  .eps = static_cast<float>(config_.rms_norm_eps),
                  .dtype = act_};
  if (k == 0 || fold_norms_) {
    p.x = stream(k).data();  // folded: the products already added the residual
  } else {
    p.x = partial_.data();
    p.residual = residual_[(k - 1) % 2].data();
    p.residual_out = residual_[k % 2].data();
  }
  return p;
}

void Runner::pre_o_proj(int64_t layer) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  const int64_t hd = config_.head_dim;
  const int64_t qkv_width = (plan_.q_heads_local + 2 * plan_.kv_heads_local) * hd;
  const KvCacheShape cs = cache_shape();
  const size_t l = static_cast<size_t>(layer);
  const QkNormRopeParams rope{.qkv = qkv_.data(),
                              .positions = positions_,
                              .inv_freq = inv_freq_.as<float>(),
                              .q_norm_weight = w.q_norm.data(),
                              .k_norm_weight = w.k_norm.data(),
                              .tokens = tokens_,
                              .num_heads = plan_.q_heads_local,
                              .num_kv_heads = plan_.kv_heads_local,
                              .head_dim = hd,
                              .eps = static_cast<float>(config_.rms_norm_eps),
                              .cos_sin_scale = static_cast<float>(config_.rope.attention_factor),
                              .dtype = act_,
                              .kv_append = KvAppendParams{.qkv = qkv_.data(),
                                                          .k_cache = k_cache_[l].data(),
                                                          .v_cache = v_cache_[l].data(),
                                                          .slots = slots_,
                                                          .positions = positions_,
                                                          .tokens = tokens_,
                                                          .num_heads = plan_.q_heads_local,
                                                          .cache = cs,
                                                          .dtype = act_}};
  LinearParams qkv{.x = normed_.data(),
                   .weight = w.qkv.data(),
                   .bias = w.qkv_bias.data(),
                   .y = qkv_.data(),
                   .rows = tokens_,
                   .in_features = config_.hidden_size,
                   .out_features = qkv_width,
                   .act_dtype = act_,
                   .weight_dtype = backend_.weight_dtype(),
                   .qk_norm_rope = rope};
  normed_input(qkv, 2 * layer, w.input_norm);
  backend_.linear(qkv);
  backend_.attention(AttentionParams{.qkv = qkv_.data(),
                                     .k_cache = k_cache_[l].data(),
                                     .v_cache = v_cache_[l].data(),
                                     .slots = slots_,
                                     .positions = positions_,
                                     .out = attn_.data(),
                                     .tokens = tokens_,
                                     .num_heads = plan_.q_heads_local,
                                     .cache = cs,
                                     .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd))),
                                     .dtype = act_,
                                     .window = config_.attention_window(layer),
                                     .tokens_per_sequence_hint = tokens_per_sequence_,
                                     .no_lower_writes = no_lower_writes_});
}

void Runner::o_proj(int64_t layer) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  // o_proj is row-parallel: its (replicated) bias is added by rank 0 only,
  // so the all-reduce that follows adds it exactly once.
  LinearParams o{.x = attn_.data(),
                 .weight = w.o_proj.data(),
                 .bias = plan_.rank == 0 ? w.o_bias.data() : nullptr,
                 .rows = tokens_,
                 .in_features = plan_.q_heads_local * config_.head_dim,
                 .out_features = config_.hidden_size,
                 .act_dtype = act_,
                 .weight_dtype = backend_.weight_dtype()};
  add_residual(o, 2 * layer + 1);
  backend_.linear(o);
}

void Runner::normed_input(LinearParams& p, int64_t k, const Buffer& norm_weight) const {
  if (fold_norms_) {
    p.x = stream(k).data();
    p.input_rms = InputRms{.eps = static_cast<float>(config_.rms_norm_eps), .normed = normed_.data()};
  } else {
    p.input_norm = input_norm(k, norm_weight);
  }
}

// Folded: the product writes sub-phase k's stream, rank 0 adding the one
// before (so that the all-reduce adds it once); else the partial, which the
// next norm adds.
void Runner::add_residual(LinearParams& p, int64_t k) {
  layer_out_ = fold_norms_ ? &stream(k) : &partial_;
  p.y = layer_out_->data();
  if (fold_norms_ && plan_.rank == 0) p.residual = stream(k - 1).data();
}

void Runner::mlp(int64_t layer) {
  const LayerWeights& w = weights_.layers[static_cast<size_t>(layer)];
  LinearParams gate_up{.x = normed_.data(),
                       .weight = w.gate_up.data(),
                       .y = gate_up_.data(),
                       .rows = tokens_,
                       .in_features = config_.hidden_size,
                       .out_features = 2 * plan_.inter_local,
                       .act_dtype = act_,
                       .weight_dtype = backend_.weight_dtype(),
                       .silu_mul = SiluMulParams{.gate_up = gate_up_.data(),
                                                 .out = act_buf_.data(),
                                                 .rows = tokens_,
                                                 .inter = plan_.inter_local,
                                                 .dtype = act_}};
  normed_input(gate_up, 2 * layer + 1, w.post_attn_norm);
  backend_.linear(gate_up);
  LinearParams down{.x = act_buf_.data(),
                    .weight = w.down.data(),
                    .rows = tokens_,
                    .in_features = plan_.inter_local,
                    .out_features = config_.hidden_size,
                    .act_dtype = act_,
                    .weight_dtype = backend_.weight_dtype()};
  add_residual(down, 2 * layer + 2);
  backend_.linear(down);
}

// The final norm runs on the logit rows only. When they are not simply all
// rows (a prompt wants the last one), they are gathered from partial and
// the residual first; the sum still goes to residual_[0], which the step
// no longer needs.
void Runner::lm_head() {
  if (logit_rows_ == 0) return;
  RmsNormParams norm = input_norm(2 * config_.num_layers, weights_.final_norm);
  if (!all_rows_logits_) {
    auto gather = [&](const void* from, const Buffer& to) {
      backend_.embedding(EmbeddingParams{.ids = logit_rows_buf_,
                                         .table = from,
                                         .out = to.data(),
                                         .tokens = logit_rows_,
                                         .hidden = config_.hidden_size,
                                         .row_begin = 0,
                                         .rows_local = tokens_,
                                         .dtype = act_,
                                         .table_dtype = act_});
    };
    gather(norm.x, lm_partial_);
    norm.x = lm_partial_.data();
    if (norm.residual != nullptr) {
      gather(norm.residual, lm_residual_);
      norm.residual = lm_residual_.data();
    }
    norm.rows = logit_rows_;
  }
  backend_.linear(LinearParams{.x = normed_.data(),
                               .weight = weights_.lm_head_weight().data(),
                               .y = logits_.data(),
                               .rows = logit_rows_,
                               .in_features = config_.hidden_size,
                               .out_features = plan_.vocab_local,
                               .act_dtype = act_,
                               .weight_dtype = backend_.weight_dtype(),
                               .input_norm = norm});
}

void Runner::argmax() {
  if (logit_rows_ == 0) return;
  backend_.argmax(ArgmaxParams{.logits = logits_.data(),
                               .values = argmax_.as<float>(),
                               .columns = argmax_.as<int32_t>() + logit_rows_ * argmax_splits_,
                               .rows = logit_rows_,
                               .cols = plan_.vocab_local,
                               .valid_cols = std::max<int64_t>(1, plan_.vocab_real_local()),
                               .split_cols = kArgmaxSplitCols,
                               .dtype = act_});
}

void Runner::next_tokens(const void* gathered_candidates) {
  if (logit_rows_ == 0) return;
  NextTokensParams p{.candidates = gathered_candidates,
                     .shares = plan_.size,
                     .splits = argmax_splits_,
                     .share_cols = plan_.vocab_local,
                     .vocab = config_.vocab_size,
                     .sampled = gathered_candidates ? nullptr : sampled_.as<int32_t>(),
                     .rows = logit_rows_,
                     .published = published_.as<int32_t>(),
                     .published_stride = limits_.max_logit_rows,
                     .published_count = published_count_.as<uint32_t>()};
  if (feeds_back_) {
    p.tokens = ids_, p.positions = positions_, p.slots = slots_;
    p.padding_slot = has_padding_slot() ? padding_slot() : -1;
    p.max_position = static_cast<int32_t>(limits_.max_seq - 1);
  }
  backend_.next_tokens(p);
}

void Runner::advance_batch(const std::vector<SampleRow>& sample_rows) {
  LS_REQUIRE(feeds_back_, ErrorKind::kInternal, "advance_batch: the batch does not feed back its tokens");
  LS_REQUIRE(static_cast<int64_t>(sample_rows.size()) == (batch_samples_ ? logit_rows_ : 0), ErrorKind::kInternal,
             "advance_batch: {} sampling settings for {} rows", sample_rows.size(), logit_rows_);
  int32_t* slots = batch_host_.data() + tokens_;
  int32_t* positions = slots + tokens_;
  for (int64_t i = 0; i < tokens_; ++i) {
    if (has_padding_slot() && slots[i] == padding_slot()) continue;
    LS_REQUIRE(positions[i] + 1 < limits_.max_seq, ErrorKind::kInvalidArgument,
               "position {} is beyond the context length {}", positions[i] + 1, limits_.max_seq);
    ++positions[i];
  }
  for (const SampleRow& s : sample_rows) s.validate();
  if (batch_samples_)
    backend_.to_backend(sample_rows_, sample_rows.data(),
                        static_cast<int64_t>(sample_rows.size() * sizeof(SampleRow)));
}

void Runner::sample(const void* gathered_logits) {
  if (logit_rows_ == 0) return;
  LS_REQUIRE(batch_samples_, ErrorKind::kInternal, "sample: the batch has no sampling settings");
  backend_.sample(SampleParams{.logits = gathered_logits,
                               .settings = sample_rows_,
                               .ids = sampled_.as<int32_t>(),
                               .rows = logit_rows_,
                               .cols = plan_.vocab_local,
                               .shards = plan_.size,
                               .valid_cols = config_.vocab_size,
                               .dtype = act_});
}

Runner::Span Runner::embedding_partial() const { return {residual_[0].data(), tokens_ * config_.hidden_size}; }
Runner::Span Runner::layer_partial() const { return {layer_out_->data(), tokens_ * config_.hidden_size}; }
Runner::Span Runner::logits_local() const { return {logits_.data(), logit_rows_ * plan_.vocab_local}; }

}  // namespace lockstep
