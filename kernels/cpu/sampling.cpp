// The sampling rule of kernels/sampling.h, straight from its definition:
// sort the row, cut top-k and top-p from the sorted prefix, then walk the
// nucleus in column order.
#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/sampling.h"
#include "kernels/sampling_math.h"

namespace lockstep::cpu {

namespace {

struct Candidate {
  uint32_t key;
  int32_t column;
};

int32_t sample_row(const SampleParams& p, int64_t row, std::vector<Candidate>& order) {
  const SampleRow& s = p.settings[row];
  const auto* logits = static_cast<const float*>(p.logits);
  order.resize(static_cast<size_t>(p.valid_cols));
  for (int64_t c = 0; c < p.valid_cols; ++c)
    order[static_cast<size_t>(c)] = {
        sampling::order_key(logits[sampling::logit_index(row, c, p.rows, p.cols, p.shards)]),
        static_cast<int32_t>(c)};
  std::sort(order.begin(), order.end(), [](const Candidate& a, const Candidate& b) {
    return a.key > b.key || (a.key == b.key && a.column < b.column);
  });
  if (!sampling::has_token(order[0].key)) return -1;
  if (s.temperature == 0.0f) return order[0].column;

  const float max_logit = sampling::key_value(order[0].key);
  const double inv_temperature = sampling::inverse_temperature(s.temperature);
  auto weight = [&](const Candidate& c) { return sampling::weight(sampling::key_value(c.key), max_logit, inv_temperature); };
  const size_t top_k = s.top_k > 0 && s.top_k < p.valid_cols ? static_cast<size_t>(s.top_k) : order.size();
  uint64_t top_k_mass = 0;
  for (size_t i = 0; i < top_k; ++i) top_k_mass += weight(order[i]);
  const uint64_t wanted = sampling::nucleus_mass(top_k_mass, s.top_p);
  size_t nucleus = 0;
  uint64_t mass = 0;
  while (mass < wanted) mass += weight(order[nucleus++]);

  const uint64_t u = sampling::draw(s.random, mass);
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(nucleus),
            [](const Candidate& a, const Candidate& b) { return a.column < b.column; });
  uint64_t running = 0;
  for (size_t i = 0; i < nucleus; ++i) {
    running += weight(order[i]);
    if (running > u) return order[i].column;
  }
  LS_FAIL(ErrorKind::kInternal, "sample: the draw {} ran past the nucleus mass {}", u, mass);
}

}  // namespace

void sample(const SampleParams& p) {
  p.validate();
  require_f32(p.dtype, "sample");
  std::vector<Candidate> order;
  for (int64_t r = 0; r < p.rows; ++r) {
    p.settings[r].validate();
    p.ids[r] = sample_row(p, r, order);
  }
}

}  // namespace lockstep::cpu
