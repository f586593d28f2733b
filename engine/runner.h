// One rank's model: its weights, KV cache and activation buffers, and the
// sub-phases of the layer sequence. The tensor-parallel group (tp/group.h)
// calls the sub-phases in order and puts its collectives between them; the
// runner itself never communicates.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/batch.h"
#include "engine/config.h"
#include "engine/weights.h"
#include "tp/sharding.h"

namespace lockstep {

class Runner {
 public:
  Runner(const ModelConfig& config, const ShardPlan& plan, ModelWeights weights, Backend& backend,
         RunnerLimits limits, Diagnostics diag);

  // Checks the batch against the model and the limits (ids in the
  // vocabulary, slots and positions in range) and copies it to the backend.
  void set_batch(const BatchDesc& batch);

  // The sub-phases, in the order the group calls them. Each RMSNorm is the
  // input stage of the projection after it (kernels/linear.h), so it reads
  // the previous sub-phase's all-reduced partial and the residual stream,
  // and writes the new residual to the other of two buffers (a fused kernel
  // reads the old residual in every block while one block writes the new).
  // Where the backend folds the layer's norms (Backend::folds_input_norms),
  // o_proj and down write the new residual themselves and layer_partial()
  // is that buffer (see stream() below).
  void embed();                    // residual <- this rank's share of the embedding
  void pre_o_proj(int64_t layer);  // input norm, QKV (+bias), q/k norm, RoPE + KV append, attention
  void o_proj(int64_t layer);      // partial (or the new residual) <- attention · o_projᵀ (row-parallel)
  void mlp(int64_t layer);         // post-attention norm, down(silu(gate) · up) -> partial (row-parallel)
  void lm_head();                  // final norm; logits_local <- normed[logit rows] · lm_headᵀ
  void argmax();                   // per logit row and split: best logit of this rank's share and its column
  // Per logit row, the token chosen by the batch's sample_rows from the
  // full-vocabulary logits [ranks][logit rows][vocab_local] (the all-gather
  // of logits_local, or logits_local itself with one rank); next_tokens
  // takes it from there.
  void sample(const void* gathered_logits);
  // Ends a step whose tokens are chosen where the logits are (the
  // next_tokens op): each logit row's token, the best of the ranks' argmax
  // candidates (`gathered_candidates`, [ranks][argmax_result]) or, with
  // null, sample()'s, is published (published_ids) and, when the batch
  // feeds back, becomes the row's next token at a position one higher.
  void next_tokens(const void* gathered_candidates);
  // Whether next_tokens makes the batch its own next decode step: every
  // token a logit row, in order, one token per sequence.
  bool batch_feeds_back() const { return feeds_back_; }
  // Makes the batch fed back by next_tokens the current one on the host
  // side too: positions one higher (checked against the context) and, for a
  // batch that samples, the new step's settings (one per logit row), uploaded.
  void advance_batch(const std::vector<SampleRow>& sample_rows);
  // The ids the k-th next_tokens published, [logit rows of that step]; host
  // memory, complete once that step is done.
  const int32_t* published_ids(int64_t k) const {
    return published_.as<int32_t>() + (k % 2) * limits_.max_logit_rows;
  }

  // The buffers the group's collectives work on (backend memory, act dtype).
  struct Span {
    void* data;
    int64_t count;
  };
  Span embedding_partial() const;  // [tokens, hidden], summed over ranks (the first residual)
  Span layer_partial() const;      // [tokens, hidden], summed over ranks
  Span logits_local() const;       // [logit rows, vocab_local]
  // Receives the all-gather of logits_local: [ranks][logit rows][vocab_local].
  void* logits_gathered() const { return logits_gathered_.data(); }
  // argmax()'s candidates, [2][logit rows][splits] 4-byte elements: the
  // float32 values, then the int32 columns.
  Span argmax_result() const { return {argmax_.data(), 2 * logit_rows_ * argmax_splits_}; }
  // Receives the all-gather of argmax_result: [ranks][argmax_result].
  void* argmax_gathered() const { return argmax_gathered_.data(); }

  const ModelConfig& config() const { return config_; }
  const ShardPlan& plan() const { return plan_; }
  const RunnerLimits& limits() const { return limits_; }
  Backend& backend() { return backend_; }
  const Diagnostics& diagnostics() const { return diag_; }
  int64_t batch_tokens() const { return tokens_; }
  // A KV-cache slot beyond the sequences' (limits().max_slots of them) for
  // the rows that pad a decode batch to its bucket size. With one sequence
  // no batch is ever padded, and no such slot is allocated.
  int32_t padding_slot() const { return static_cast<int32_t>(limits_.max_slots); }
  bool has_padding_slot() const { return limits_.max_slots > 1; }
  int64_t batch_logit_rows() const { return logit_rows_; }
  // The batch's AttentionParams::no_lower_writes, which a captured step bakes in.
  bool batch_no_lower_writes() const { return no_lower_writes_; }
  // Copies the keys and values of positions [0, positions) of sequence slot
  // `from` to slot `to` in every layer (a shared prompt prefix), queued
  // before the next step.
  void copy_kv_prefix(int32_t from, int32_t to, int64_t positions);
  // Logs what --diag asked for after a layer (called by the group).
  void log_layer_diagnostics(int64_t layer, double seconds);

 private:
  KvCacheShape cache_shape() const;
  // Norm k of the step (2·layer before attention, 2·layer + 1 before the
  // MLP, 2·layers the final one): rms_norm(partial + residual) · weight into
  // normed_, the sum into the other residual buffer; norm 0 normalizes the
  // embedding alone.
  RmsNormParams input_norm(int64_t k, const Buffer& weight) const;
  // Where backend.folds_input_norms() (the norm weights folded into W_qkv
  // and W_gate_up at load), the layer runs no norm kernels: qkv and gate_up
  // read the stream itself with LinearParams::input_rms, and o_proj and down
  // add the residual (LinearParams::residual) into the next stream buffer.
  const Buffer& stream(int64_t k) const;
  void normed_input(LinearParams& p, int64_t k, const Buffer& norm_weight) const;
  void add_residual(LinearParams& p, int64_t k);
  void log_batch_diagnostics(const BatchDesc& batch) const;

  ModelConfig config_;
  ShardPlan plan_;
  ModelWeights weights_;
  Backend& backend_;
  RunnerLimits limits_;
  Diagnostics diag_;
  DType act_;
  bool fold_norms_;
  const Buffer* layer_out_ = nullptr;  // what o_proj or down wrote last (layer_partial)
  std::vector<float> inv_freq_host_;
  Buffer inv_freq_;
  std::vector<Buffer> k_cache_, v_cache_;  // per layer
  // The batch arrays, one buffer of 4-byte elements filled by one copy per
  // step: [ids | slots | positions] (the batch's tokens each), the logit
  // rows, then (8-byte aligned) the logit rows' sampling settings when the
  // batch has them; sized for max_step_tokens and max_logit_rows, and the
  // pointers below are set by set_batch.
  Buffer batch_arrays_;
  std::vector<int32_t> batch_host_;
  int32_t* ids_ = nullptr;
  int32_t* slots_ = nullptr;
  int32_t* positions_ = nullptr;
  int32_t* logit_rows_buf_ = nullptr;
  SampleRow* sample_rows_ = nullptr;
  bool batch_samples_ = false;  // the batch came with sample_rows
  Buffer argmax_, argmax_gathered_, sampled_;
  int64_t argmax_splits_ = 1;    // argmax candidates per row (kArgmaxSplitCols columns each)
  Buffer published_;             // host-visible [2][max_logit_rows] ids (next_tokens)
  Buffer published_count_;       // the backend's count of next_tokens calls (uint32)
  bool feeds_back_ = false;      // see batch_feeds_back()
  Buffer residual_[2], normed_, qkv_, attn_, partial_, gate_up_, act_buf_, logits_, logits_gathered_;
  Buffer lm_partial_, lm_residual_;  // the logit rows of partial and residual, when not all rows are
  bool all_rows_logits_ = false;     // the logit rows are the batch's rows in order
  int64_t tokens_ = 0;
  int64_t tokens_per_sequence_ = 1;  // the longest run of consecutive tokens of one slot
  bool no_lower_writes_ = false;     // see AttentionParams::no_lower_writes
  std::vector<int32_t> slot_min_position_;  // set_batch's scratch
  int64_t logit_rows_ = 0;
};

}  // namespace lockstep
