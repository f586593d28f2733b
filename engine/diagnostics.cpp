// --diag: the runner's optional diagnostics, parsed and emitted in one place.
#include <cmath>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/error.h"
#include "engine/batch.h"
#include "engine/runner.h"

namespace lockstep {

void RunnerLimits::validate() const {
  LS_REQUIRE(max_slots > 0 && max_seq > 0 && max_step_tokens > 0 && max_logit_rows > 0,
             ErrorKind::kInvalidArgument, "runner limits must be positive (slots={}, seq={}, step={}, rows={})",
             max_slots, max_seq, max_step_tokens, max_logit_rows);
  LS_REQUIRE(max_seq <= INT32_MAX && max_slots <= INT32_MAX, ErrorKind::kInvalidArgument, "limits too large");
  LS_REQUIRE(max_step_tokens >= max_slots && max_logit_rows >= max_slots, ErrorKind::kInvalidArgument,
             "a step must hold a token of every slot (slots={}, step={}, rows={})", max_slots, max_step_tokens,
             max_logit_rows);
}

Diagnostics Diagnostics::parse(const std::string& list) {
  Diagnostics d;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    if (item == "shapes") d.shapes = true;
    else if (item == "attn") d.attn = true;
    else if (item == "timing") d.timing = true;
    else if (item == "numerics") d.numerics = true;
    else LS_FAIL(ErrorKind::kInvalidArgument, "unknown --diag item '{}' (expected shapes, attn, timing, numerics)", item);
  }
  return d;
}

void Runner::log_batch_diagnostics(const BatchDesc& b) const {
  if (diag_.shapes)
    spdlog::info("diag shapes: tokens={} logit_rows={} residual=[{}, {}] qkv=[{}, {}] gate_up=[{}, {}] logits=[{}, {}]",
                 b.size(), b.logit_rows.size(), b.size(), config_.hidden_size, b.size(),
                 (plan_.q_heads_local + 2 * plan_.kv_heads_local) * config_.head_dim, b.size(),
                 2 * plan_.inter_local, b.logit_rows.size(), plan_.vocab_local);
  if (diag_.attn) {
    std::string lens;
    for (int64_t i = 0; i < b.size(); ++i)
      lens += fmt::format("{}{}:{}", i == 0 ? "" : " ", b.slots[static_cast<size_t>(i)],
                          b.positions[static_cast<size_t>(i)] + 1);
    spdlog::info("diag attn (slot:length): {}", lens);
  }
}

void Runner::log_layer_diagnostics(int64_t layer, double seconds) {
  if (diag_.timing) spdlog::info("diag timing: layer {} {:.3f} ms", layer, seconds * 1e3);
  if (!diag_.numerics) return;
  // After a layer the stream is the residual plus the all-reduced partial
  // (the next norm adds them): summed here in float32. With the norms folded
  // the products have added them already.
  const int64_t n = tokens_ * config_.hidden_size;
  auto download = [&](const Buffer& from) {
    std::vector<uint8_t> raw(static_cast<size_t>(n) * dtype_size(act_));
    backend_.to_host(raw.data(), from.data(), static_cast<int64_t>(raw.size()));
    std::vector<float> v(static_cast<size_t>(n));
    convert_to_f32(raw.data(), act_, v.data(), v.size());
    return v;
  };
  std::vector<float> v = download(stream(fold_norms_ ? 2 * layer + 2 : 2 * layer + 1));
  if (!fold_norms_) {
    const std::vector<float> partial = download(partial_);
    for (size_t i = 0; i < v.size(); ++i) v[i] += partial[i];
  }
  double lo = INFINITY, hi = -INFINITY, sum = 0, sq = 0;
  int64_t nonfinite = 0;
  for (float x : v) {
    if (!std::isfinite(x)) {
      ++nonfinite;
      continue;
    }
    lo = std::min(lo, static_cast<double>(x));
    hi = std::max(hi, static_cast<double>(x));
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  spdlog::info("diag numerics: layer {} residual min={:.4g} max={:.4g} mean={:.4g} rms={:.4g} nonfinite={}", layer,
               lo, hi, sum / static_cast<double>(n), std::sqrt(sq / static_cast<double>(n)), nonfinite);
}

}  // namespace lockstep
