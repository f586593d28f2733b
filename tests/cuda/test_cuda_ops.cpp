// The elementwise, normalization, rotary and linear CUDA ops against the
// float32 CPU reference on odd sizes, in every dtype (tolerances in
// cuda_test_support.h).
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "engine/config.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/ops.h"
#include "tests/cuda/cuda_test_support.h"

namespace lockstep {
namespace {

std::string label(int64_t rows, int64_t cols) { return "rows=" + std::to_string(rows) + " cols=" + std::to_string(cols); }

TEST_F(CudaOpTest, EmbeddingMatchesCpu) {
  std::mt19937 rng(1);
  for (DType dt : all_dtypes())
    for (int64_t tokens : odd_rows())
      for (int64_t hidden : {64, 111}) {
        const int64_t rows_local = 50, row_begin = 25;
        std::vector<float> table = random_values(rows_local * hidden, dt, rng);
        std::vector<int32_t> ids(static_cast<size_t>(tokens));
        std::uniform_int_distribution<int32_t> pick(0, 99);  // some outside this shard
        for (auto& id : ids) id = pick(rng);
        DeviceArray d_table(table, dt), d_ids(ids), d_out(tokens * hidden, dt);
        EmbeddingParams p{.ids = d_ids.ints(), .table = d_table.get(), .out = d_out.get(), .tokens = tokens,
                          .hidden = hidden, .row_begin = row_begin, .rows_local = rows_local, .dtype = dt, .table_dtype = dt};
        cuda::embedding(p, stream_);
        sync();
        std::vector<float> want(static_cast<size_t>(tokens * hidden));
        EmbeddingParams c = p;
        c.ids = ids.data(), c.table = table.data(), c.out = want.data(), c.dtype = c.table_dtype = DType::kF32;
        cpu::embedding(c);
        expect_close(d_out.download(), want, DType::kF32, "embedding " + label(tokens, hidden));  // exact copy
      }
}

TEST_F(CudaOpTest, RmsNormMatchesCpu) {
  std::mt19937 rng(2);
  for (DType dt : all_dtypes())
    for (int64_t rows : odd_rows())
      for (int64_t cols : {64, 111, 4096})
        for (bool fused : {false, true}) {
          const bool weighted = !(fused && cols == 111);  // a null weight (ones) in some fused cases
          std::vector<float> x = random_values(rows * cols, dt, rng);
          std::vector<float> res = random_values(rows * cols, dt, rng, 4.0f);
          std::vector<float> w = random_values(cols, dt, rng);
          DeviceArray d_x(x, dt), d_res(res, dt), d_w(w, dt), d_out(rows * cols, dt);
          RmsNormParams p{.x = d_x.get(), .residual = fused ? d_res.get() : nullptr,
                          .residual_out = fused ? d_res.get() : nullptr, .weight = weighted ? d_w.get() : nullptr,
                          .out = d_out.get(),
                          .rows = rows, .cols = cols, .eps = 1e-6f, .dtype = dt};
          cuda::rms_norm(p, stream_);
          sync();
          std::vector<float> want(x.size());
          RmsNormParams c = p;
          c.x = x.data(), c.residual = fused ? res.data() : nullptr, c.residual_out = fused ? res.data() : nullptr;
          c.weight = weighted ? w.data() : nullptr, c.out = want.data(), c.dtype = DType::kF32;
          cpu::rms_norm(c);
          const std::string what = "rms_norm " + label(rows, cols) + (fused ? " fused" : "");
          expect_close(d_out.download(), want, dt, what);
          if (fused) expect_close(d_res.download(), res, dt, what + " residual");
        }
}

TEST_F(CudaOpTest, SiluMulMatchesCpu) {
  std::mt19937 rng(3);
  for (DType dt : all_dtypes())
    for (int64_t rows : odd_rows())
      for (int64_t inter : {64, 111, 1408}) {
        std::vector<float> gu = random_values(rows * 2 * inter, dt, rng, 2.0f);
        DeviceArray d_gu(gu, dt), d_out(rows * inter, dt);
        SiluMulParams p{.gate_up = d_gu.get(), .out = d_out.get(), .rows = rows, .inter = inter, .dtype = dt};
        cuda::silu_mul(p, stream_);
        sync();
        std::vector<float> want(static_cast<size_t>(rows * inter));
        cpu::silu_mul(SiluMulParams{.gate_up = gu.data(), .out = want.data(), .rows = rows, .inter = inter});
        expect_close(d_out.download(), want, dt, "silu_mul " + label(rows, inter));
      }
}

struct RopeCase {
  int64_t heads, kv_heads, head_dim;
  bool qk_norm;
  RopeType rope;
};

TEST_F(CudaOpTest, QkNormRopeMatchesCpu) {
  std::mt19937 rng(4);
  const std::vector<RopeCase> cases{{4, 4, 64, false, RopeType::kDefault}, {8, 2, 128, true, RopeType::kDefault},
                                    {10, 2, 64, true, RopeType::kLlama3},   {16, 2, 128, false, RopeType::kLlama3},
                                    {8, 1, 256, true, RopeType::kDefault},  {32, 8, 128, false, RopeType::kLlama3},
                                    {8, 2, 128, true, RopeType::kYarn},
                                    // head_dim 2 mod 4: one element a lane access
                                    {3, 1, 18, true, RopeType::kDefault},   {6, 2, 10, false, RopeType::kLlama3},
                                    // 36 heads: 989 tokens take two heads a warp, the last block four heads
                                    {28, 4, 64, true, RopeType::kDefault},  {32, 8, 128, true, RopeType::kYarn}};
  for (DType dt : all_dtypes())
    for (int64_t tokens : odd_rows())
      for (const RopeCase& rc : cases) {
        RopeConfig rope{.type = rc.rope, .theta = 500000.0, .factor = 8.0, .low_freq_factor = 1.0,
                        .high_freq_factor = 4.0, .original_max_position = 8192};
        if (rc.rope == RopeType::kYarn) rope.attention_factor = 0.1 * std::log(rope.factor) + 1.0;
        std::vector<float> inv_freq = rope_inv_freq(rope, rc.head_dim);
        const int64_t width = (rc.heads + 2 * rc.kv_heads) * rc.head_dim;
        std::vector<float> qkv = random_values(tokens * width, dt, rng);
        std::vector<float> qn = random_values(rc.head_dim, dt, rng), kn = random_values(rc.head_dim, dt, rng);
        std::vector<int32_t> pos(static_cast<size_t>(tokens));
        std::uniform_int_distribution<int32_t> pick(0, 131071);
        for (auto& v : pos) v = pick(rng);
        DeviceArray d_qkv(qkv, dt), d_pos(pos), d_freq(inv_freq, DType::kF32), d_qn(qn, dt), d_kn(kn, dt);
        QkNormRopeParams p{.qkv = d_qkv.get(), .positions = d_pos.ints(), .inv_freq = static_cast<float*>(d_freq.get()),
                           .q_norm_weight = rc.qk_norm ? d_qn.get() : nullptr,
                           .k_norm_weight = rc.qk_norm ? d_kn.get() : nullptr, .tokens = tokens,
                           .num_heads = rc.heads, .num_kv_heads = rc.kv_heads, .head_dim = rc.head_dim, .eps = 1e-6f,
                           .cos_sin_scale = static_cast<float>(rope.attention_factor), .dtype = dt};
        cuda::qk_norm_rope(p, stream_);
        sync();
        QkNormRopeParams c = p;
        c.qkv = qkv.data(), c.positions = pos.data(), c.inv_freq = inv_freq.data(), c.dtype = DType::kF32;
        c.q_norm_weight = rc.qk_norm ? qn.data() : nullptr, c.k_norm_weight = rc.qk_norm ? kn.data() : nullptr;
        cpu::qk_norm_rope(c);
        expect_close(d_qkv.download(), qkv, dt,
                     "qk_norm_rope tokens=" + std::to_string(tokens) + " heads=" + std::to_string(rc.heads) + "/" +
                         std::to_string(rc.kv_heads) + " hd=" + std::to_string(rc.head_dim));
      }
}

struct LinearCase {
  int64_t in, out, x_stride;
  bool bias;
};

TEST_F(CudaOpTest, LinearMatchesCpu) {
  std::mt19937 rng(5);
  cuda::LinearContext ctx;
  const std::vector<LinearCase> cases{{64, 96, 0, false}, {128, 77, 136, true}, {1024, 1000, 0, true}};
  std::vector<int64_t> rows_list = odd_rows();
  rows_list.push_back(2);  // the two-row GEMV
  for (DType dt : all_dtypes())
    for (int64_t rows : rows_list)
      for (const LinearCase& lc : cases) {
        const int64_t xs = lc.x_stride == 0 ? lc.in : lc.x_stride;
        std::vector<float> x = random_values(rows * xs, dt, rng);
        std::vector<float> w = random_values(lc.out * lc.in, dt, rng, 0.05f);
        std::vector<float> b = random_values(lc.out, dt, rng);
        DeviceArray d_x(x, dt), d_w(w, dt), d_b(b, dt), d_y(rows * lc.out, dt);
        LinearParams p{.x = d_x.get(), .weight = d_w.get(), .bias = lc.bias ? d_b.get() : nullptr, .y = d_y.get(),
                       .rows = rows, .in_features = lc.in, .out_features = lc.out, .x_stride = lc.x_stride,
                       .act_dtype = dt, .weight_dtype = dt};
        cuda::linear(p, ctx, stream_);
        sync();
        std::vector<float> want(static_cast<size_t>(rows * lc.out));
        LinearParams c = p;
        c.x = x.data(), c.weight = w.data(), c.bias = lc.bias ? b.data() : nullptr, c.y = want.data();
        c.act_dtype = c.weight_dtype = DType::kF32;
        cpu::linear(c);
        expect_close(d_y.download(), want, dt, "linear " + label(rows, lc.in) + " out=" + std::to_string(lc.out));
      }
}

// The KV append fused into qk_norm_rope: the cache gets the rotated k and
// the v of each token (a distinct slot and position per token), in either
// cache layout (the engine's CUDA cache is position-major; head-major is the
// CPU's).
TEST_F(CudaOpTest, QkNormRopeKvAppendMatchesCpu) {
  std::mt19937 rng(7);
  // 32/8 heads: 989 tokens take two heads a warp; head_dim 18: one element a lane access.
  const std::vector<RopeCase> cases{{8, 2, 128, true, RopeType::kLlama3}, {5, 5, 64, false, RopeType::kDefault},
                                    {4, 1, 16, false, RopeType::kDefault}, {32, 8, 64, true, RopeType::kLlama3},
                                    {4, 2, 18, true, RopeType::kDefault}};
  for (DType dt : all_dtypes())
    for (int64_t tokens : odd_rows())
      for (const RopeCase& rc : cases)
        for (bool head_major : {false, true}) {
          RopeConfig rope{.type = rc.rope, .theta = 500000.0, .factor = 8.0, .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0, .original_max_position = 8192};
          std::vector<float> inv_freq = rope_inv_freq(rope, rc.head_dim);
          const KvCacheShape cache{.num_slots = 16, .max_seq = 64, .num_kv_heads = rc.kv_heads,
                                   .head_dim = rc.head_dim, .head_major = head_major};
          const int64_t width = (rc.heads + 2 * rc.kv_heads) * rc.head_dim;
          std::vector<float> qkv = random_values(tokens * width, dt, rng);
          std::vector<float> qn = random_values(rc.head_dim, dt, rng), kn = random_values(rc.head_dim, dt, rng);
          std::vector<float> k = random_cache_values(cache.num_slots * cache.slot_stride(), dt, rng);
          std::vector<float> v = random_cache_values(cache.num_slots * cache.slot_stride(), dt, rng);
          std::vector<int32_t> slots(static_cast<size_t>(tokens)), pos(static_cast<size_t>(tokens));
          for (int64_t t = 0; t < tokens; ++t)
            slots[t] = static_cast<int32_t>(t % 16), pos[t] = static_cast<int32_t>(t / 16);
          DeviceArray d_qkv(qkv, dt), d_pos(pos), d_slots(slots), d_freq(inv_freq, DType::kF32), d_qn(qn, dt),
              d_kn(kn, dt), d_k(k, dt), d_v(v, dt);
          QkNormRopeParams p{.qkv = d_qkv.get(), .positions = d_pos.ints(),
                             .inv_freq = static_cast<float*>(d_freq.get()),
                             .q_norm_weight = rc.qk_norm ? d_qn.get() : nullptr,
                             .k_norm_weight = rc.qk_norm ? d_kn.get() : nullptr, .tokens = tokens,
                             .num_heads = rc.heads, .num_kv_heads = rc.kv_heads, .head_dim = rc.head_dim, .eps = 1e-6f,
                             .dtype = dt,
                             .kv_append = KvAppendParams{.qkv = d_qkv.get(), .k_cache = d_k.get(), .v_cache = d_v.get(),
                                                         .slots = d_slots.ints(), .positions = d_pos.ints(),
                                                         .tokens = tokens, .num_heads = rc.heads, .cache = cache,
                                                         .dtype = dt}};
          cuda::qk_norm_rope(p, stream_);
          sync();
          QkNormRopeParams c = p;
          c.qkv = qkv.data(), c.positions = pos.data(), c.inv_freq = inv_freq.data(), c.dtype = DType::kF32;
          c.q_norm_weight = rc.qk_norm ? qn.data() : nullptr, c.k_norm_weight = rc.qk_norm ? kn.data() : nullptr;
          c.kv_append->qkv = qkv.data(), c.kv_append->k_cache = k.data(), c.kv_append->v_cache = v.data();
          c.kv_append->slots = slots.data(), c.kv_append->positions = pos.data(), c.kv_append->dtype = DType::kF32;
          cpu::qk_norm_rope(c);
          const std::string what = "rope+append tokens=" + std::to_string(tokens) +
                                   " hd=" + std::to_string(rc.head_dim) + (head_major ? " head-major" : "");
          expect_close(d_qkv.download(), qkv, dt, what + " qkv");
          expect_close(d_k.download(), k, dt, what + " K");  // the rotated k, rounded once as in qkv
          expect_close(d_v.download(), v, DType::kF32, what + " V");  // exact copies
        }
}

struct StagedLinearCase {
  int64_t in, inter_or_out;
  bool norm, residual, silu, bias;
};

// The linear op with its input norm and SiLU·mul stages, fused (one or two
// rows, the GEMV) or as separate kernels (more rows, unaligned sizes, or a
// staged input above 48 KB), against the CPU running the stages as ops.
// Points a linear op's input norm, copied from the GPU launch, at the host
// buffers of the float32 CPU reference (residual null: no residual add).
void on_host(RmsNormParams& n, std::vector<float>& x, std::vector<float>* residual, std::vector<float>* residual_out,
             std::vector<float>& weight, std::vector<float>& out) {
  n.x = x.data(), n.residual = residual ? residual->data() : nullptr;
  n.residual_out = residual ? residual_out->data() : nullptr;
  n.weight = weight.data(), n.out = out.data(), n.dtype = DType::kF32;
}

TEST_F(CudaOpTest, LinearStagesMatchCpu) {
  std::mt19937 rng(8);
  cuda::LinearContext ctx;
  const std::vector<StagedLinearCase> cases{
      {64, 96, true, false, false, false},   {1024, 200, true, true, false, true}, {4096, 136, true, true, true, false},
      {256, 40, false, false, true, true},   {120, 33, true, true, true, false},   {16384, 24, true, true, false, false},
      {4096, 1000, true, true, true, true}};
  for (DType dt : all_dtypes())
    for (int64_t rows : {1, 2, 7, 19})
      for (const StagedLinearCase& lc : cases) {
        const int64_t out = lc.silu ? 2 * lc.inter_or_out : lc.inter_or_out;
        std::vector<float> x = random_values(rows * lc.in, dt, rng), res = random_values(rows * lc.in, dt, rng, 4.0f);
        std::vector<float> nw = random_values(lc.in, dt, rng), w = random_values(out * lc.in, dt, rng, 0.05f);
        std::vector<float> b = random_values(out, dt, rng), res_out(res.size()), normed(x.size()), y(rows * out);
        std::vector<float> act(static_cast<size_t>(rows * lc.inter_or_out));
        DeviceArray d_x(x, dt), d_res(res, dt), d_nw(nw, dt), d_w(w, dt), d_b(b, dt), d_res_out(rows * lc.in, dt),
            d_normed(rows * lc.in, dt), d_y(rows * out, dt), d_act(rows * lc.inter_or_out, dt);
        LinearParams p{.x = lc.norm ? d_normed.get() : d_x.get(), .weight = d_w.get(),
                       .bias = lc.bias ? d_b.get() : nullptr, .y = d_y.get(), .rows = rows, .in_features = lc.in,
                       .out_features = out, .act_dtype = dt, .weight_dtype = dt};
        if (lc.norm)
          p.input_norm = RmsNormParams{.x = d_x.get(), .residual = lc.residual ? d_res.get() : nullptr,
                                       .residual_out = lc.residual ? d_res_out.get() : nullptr, .weight = d_nw.get(),
                                       .out = d_normed.get(), .rows = rows, .cols = lc.in, .eps = 1e-5f, .dtype = dt};
        if (lc.silu)
          p.silu_mul = SiluMulParams{.gate_up = d_y.get(), .out = d_act.get(), .rows = rows, .inter = lc.inter_or_out,
                                     .dtype = dt};
        cuda::linear(p, ctx, stream_);
        sync();
        LinearParams c = p;
        c.x = lc.norm ? normed.data() : x.data(), c.weight = w.data(), c.bias = lc.bias ? b.data() : nullptr;
        c.y = y.data(), c.act_dtype = c.weight_dtype = DType::kF32;
        if (lc.norm) on_host(*c.input_norm, x, lc.residual ? &res : nullptr, &res_out, nw, normed);
        if (lc.silu) c.silu_mul->gate_up = y.data(), c.silu_mul->out = act.data(), c.silu_mul->dtype = DType::kF32;
        cpu::linear(c);
        const std::string what = "linear stages " + label(rows, lc.in) + " out=" + std::to_string(out) +
                                 (lc.norm ? " norm" : "") + (lc.residual ? "+residual" : "") + (lc.silu ? " silu" : "");
        if (lc.silu)
          expect_close(d_act.download(), act, dt, what);  // y is scratch a fused kernel leaves unwritten
        else
          expect_close(d_y.download(), y, dt, what);
        if (lc.residual) expect_close(d_res_out.download(), res_out, dt, what + " residual");
      }
}

// The folded input norm (input_rms) with the SiLU·mul stage: the GEMV scales
// its dot products (one or two rows), else the stage kernel scales cuBLASLt's
// rows, or from 128 rows the rows are normed into InputRms::normed first; and
// the residual add (o_proj, down) in the GEMV's epilogue or as cuBLASLt's C.
// Against the CPU twin, whose float64 check is in test_ops_cpu.
TEST_F(CudaOpTest, LinearFoldedNormAndResidualMatchCpu) {
  std::mt19937 rng(11);
  cuda::LinearContext ctx;
  struct Case {
    int64_t in, inter_or_out;
    bool bias;
  };
  // 66048 columns: 1-2 float32 rows exceed the GEMV's scratch and go to cuBLASLt and the stage kernel.
  const std::vector<Case> cases{{4096, 136, false}, {256, 40, true}, {120, 33, false}, {1024, 1000, true},
                                {66048, 8, false}};
  for (DType dt : all_dtypes())
    for (int64_t rows : {1, 2, 7, 19, 111, 130})
      for (const Case& lc : cases) {
        const int64_t out = 2 * lc.inter_or_out;
        std::vector<float> x = random_values(rows * lc.in, dt, rng, 4.0f), w = random_values(out * lc.in, dt, rng, 0.05f);
        std::vector<float> b = random_values(out, dt, rng), y(rows * out), act(rows * lc.inter_or_out);
        std::vector<float> res = random_values(rows * out, dt, rng, 4.0f);
        DeviceArray d_x(x, dt), d_w(w, dt), d_b(b, dt), d_y(rows * out, dt), d_act(rows * lc.inter_or_out, dt),
            d_res(res, dt), d_normed(rows * lc.in, dt);
        LinearParams p{.x = d_x.get(), .weight = d_w.get(), .bias = lc.bias ? d_b.get() : nullptr, .y = d_y.get(),
                       .rows = rows, .in_features = lc.in, .out_features = out, .act_dtype = dt, .weight_dtype = dt,
                       .silu_mul = SiluMulParams{.gate_up = d_y.get(), .out = d_act.get(), .rows = rows,
                                                 .inter = lc.inter_or_out, .dtype = dt},
                       .input_rms = InputRms{.eps = 1e-5f, .normed = d_normed.get()}};
        cuda::linear(p, ctx, stream_);
        sync();
        LinearParams c = p;
        c.x = x.data(), c.weight = w.data(), c.bias = lc.bias ? b.data() : nullptr, c.y = y.data();
        c.act_dtype = c.weight_dtype = DType::kF32;
        c.silu_mul->gate_up = y.data(), c.silu_mul->out = act.data(), c.silu_mul->dtype = DType::kF32;
        cpu::linear(c);
        const std::string what = "linear folded norm " + label(rows, lc.in) + " out=" + std::to_string(out);
        expect_close(d_act.download(), act, dt, what + " silu");
        // The residual add, on the same product without stages.
        LinearParams r = p;
        r.silu_mul.reset(), r.input_rms.reset(), r.residual = d_res.get();
        cuda::linear(r, ctx, stream_);
        sync();
        LinearParams rc = r;
        rc.x = x.data(), rc.weight = w.data(), rc.bias = lc.bias ? b.data() : nullptr, rc.y = y.data();
        rc.residual = res.data(), rc.act_dtype = rc.weight_dtype = DType::kF32;
        cpu::linear(rc);
        expect_close(d_y.download(), y, dt, "linear residual " + label(rows, lc.in) + " out=" + std::to_string(out));
      }
}

struct RopeStageCase {
  int64_t in, heads, kv_heads, head_dim;
  bool bias, qk_norm, input_norm;
  bool folded = false;  // input_rms on the un-normed rows (the norm weight folded into W)
};

// The QKV product with its q/k norm + RoPE + KV append stage: fused into the
// GEMV (one or two rows, no q/k norm, head_dim a multiple of 8) or the rope
// kernel after the product, against the CPU running the ops in sequence.
// Positions reach the thousands, where the angle needs double precision.
TEST_F(CudaOpTest, LinearRopeStageMatchesCpu) {
  std::mt19937 rng(10);
  cuda::LinearContext ctx;
  const std::vector<RopeStageCase> cases{{256, 4, 2, 128, false, false, true}, {136, 5, 1, 64, true, false, false},
                                         {64, 3, 3, 72, false, false, true},   {128, 4, 2, 36, true, false, true},
                                         {256, 4, 2, 128, false, true, true},  {256, 4, 2, 128, false, false, false},
                                         {256, 4, 2, 128, true, false, false, true},
                                         {256, 4, 2, 128, true, true, false, true},
                                         {136, 5, 1, 64, false, false, false, true},
                                         {64, 32, 8, 64, true, true, false, true}};
  const RopeConfig llama3{.type = RopeType::kLlama3, .theta = 500000.0, .factor = 8.0, .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0, .original_max_position = 8192};
  // YaRN also scales cos and sin (the GEMV's fused rotation and the rope kernel).
  const RopeConfig yarn{.type = RopeType::kYarn, .theta = 1000000.0, .factor = 4.0,
                        .original_max_position = 32768, .attention_factor = 0.1 * std::log(4.0) + 1.0};
  for (DType dt : all_dtypes())
    for (int64_t rows : {1, 2, 3, 7, 130, 700})
      for (const RopeStageCase& rc : cases)
        for (const RopeConfig& rope : {llama3, yarn}) {
        if (rows >= 130 && !rc.folded) continue;  // 130 rows: the folded norm normed into scratch first
        if (rows == 700 && rc.heads < 32) continue;  // 700 rows of 48 heads: two heads a warp in the rope kernel
        const std::vector<float> inv_freq = rope_inv_freq(rope, rc.head_dim);
        const KvCacheShape cache{.num_slots = 4, .max_seq = 3000, .num_kv_heads = rc.kv_heads, .head_dim = rc.head_dim};
        const int64_t out = (rc.heads + 2 * rc.kv_heads) * rc.head_dim;
        std::vector<float> x = random_values(rows * rc.in, dt, rng, rc.folded ? 4.0f : 1.0f);
        std::vector<float> w = random_values(out * rc.in, dt, rng, 0.1f);
        std::vector<float> b = random_values(out, dt, rng), y(static_cast<size_t>(rows * out));
        std::vector<float> qn = random_values(rc.head_dim, dt, rng), kn = random_values(rc.head_dim, dt, rng);
        std::vector<float> k = random_cache_values(cache.num_slots * cache.slot_stride(), dt, rng);
        std::vector<float> v = random_cache_values(cache.num_slots * cache.slot_stride(), dt, rng);
        std::vector<int32_t> slots(static_cast<size_t>(rows)), pos(static_cast<size_t>(rows));
        for (int64_t t = 0; t < rows; ++t)
          slots[t] = static_cast<int32_t>(t % 4), pos[t] = static_cast<int32_t>(2999 - (rows > 130 ? 4 : rows > 7 ? 23 : 411) * t);
        // The input norm with the residual add (the QKV product of a layer after the first).
        std::vector<float> res = random_values(rows * rc.in, dt, rng, 4.0f), nw = random_values(rc.in, dt, rng);
        std::vector<float> res_out(res.size()), normed(x.size());
        DeviceArray d_x(x, dt), d_w(w, dt), d_b(b, dt), d_y(rows * out, dt), d_pos(pos), d_slots(slots),
            d_freq(inv_freq, DType::kF32), d_qn(qn, dt), d_kn(kn, dt), d_k(k, dt), d_v(v, dt), d_res(res, dt),
            d_nw(nw, dt), d_res_out(rows * rc.in, dt), d_normed(rows * rc.in, dt), d_scratch(rows * rc.in, dt);
        LinearParams p{.x = rc.input_norm ? d_normed.get() : d_x.get(), .weight = d_w.get(),
                       .bias = rc.bias ? d_b.get() : nullptr, .y = d_y.get(), .rows = rows, .in_features = rc.in,
                       .out_features = out, .act_dtype = dt, .weight_dtype = dt};
        if (rc.input_norm)
          p.input_norm = RmsNormParams{.x = d_x.get(), .residual = d_res.get(), .residual_out = d_res_out.get(),
                                       .weight = d_nw.get(), .out = d_normed.get(), .rows = rows, .cols = rc.in,
                                       .eps = 1e-5f, .dtype = dt};
        if (rc.folded) p.input_rms = InputRms{.eps = 1e-5f, .normed = d_scratch.get()};
        p.qk_norm_rope = QkNormRopeParams{
            .qkv = d_y.get(), .positions = d_pos.ints(), .inv_freq = static_cast<float*>(d_freq.get()),
            .q_norm_weight = rc.qk_norm ? d_qn.get() : nullptr, .k_norm_weight = rc.qk_norm ? d_kn.get() : nullptr,
            .tokens = rows, .num_heads = rc.heads, .num_kv_heads = rc.kv_heads, .head_dim = rc.head_dim,
            .eps = 1e-6f, .cos_sin_scale = static_cast<float>(rope.attention_factor), .dtype = dt,
            .kv_append = KvAppendParams{.qkv = d_y.get(), .k_cache = d_k.get(), .v_cache = d_v.get(),
                                        .slots = d_slots.ints(), .positions = d_pos.ints(), .tokens = rows,
                                        .num_heads = rc.heads, .cache = cache, .dtype = dt}};
        cuda::linear(p, ctx, stream_);
        sync();
        LinearParams c = p;
        c.x = rc.input_norm ? normed.data() : x.data(), c.weight = w.data(), c.bias = rc.bias ? b.data() : nullptr;
        c.y = y.data(), c.act_dtype = c.weight_dtype = DType::kF32;
        if (rc.input_norm) on_host(*c.input_norm, x, &res, &res_out, nw, normed);
        QkNormRopeParams& r = *c.qk_norm_rope;
        r.qkv = y.data(), r.positions = pos.data(), r.inv_freq = inv_freq.data(), r.dtype = DType::kF32;
        r.q_norm_weight = rc.qk_norm ? qn.data() : nullptr, r.k_norm_weight = rc.qk_norm ? kn.data() : nullptr;
        r.kv_append->qkv = y.data(), r.kv_append->k_cache = k.data(), r.kv_append->v_cache = v.data();
        r.kv_append->slots = slots.data(), r.kv_append->positions = pos.data(), r.kv_append->dtype = DType::kF32;
        cpu::linear(c);
        const std::string what = "linear+rope " + label(rows, rc.in) + " hd=" + std::to_string(rc.head_dim) +
                                 (rc.bias ? " bias" : "") + (rc.qk_norm ? " qk_norm" : "") +
                                 (rc.input_norm ? " input_norm" : "") + (rc.folded ? " folded" : "") +
                                 " rope=" + rope_type_name(rope.type);
        expect_close(d_y.download(), y, dt, what + " qkv");
        if (rc.input_norm) expect_close(d_res_out.download(), res_out, dt, what + " residual");
        expect_close(d_k.download(), k, dt, what + " K");
        expect_close(d_v.download(), v, dt, what + " V");
      }
}

TEST_F(CudaOpTest, ArgmaxMatchesCpu) {
  std::mt19937 rng(6);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (DType dt : all_dtypes())
    for (int64_t rows : odd_rows())
      for (int64_t cols : {1, 111, 32000, 128256})
        for (int64_t split_cols : {0, 4096, 1000, 37}) {
          if (rows > 19 && split_cols != 4096) continue;  // the many-row cases once
          std::vector<float> logits = random_values(rows * cols, dt, rng);
          const int64_t valid = std::max<int64_t>(1, cols - 3);
          // Ties, the lower column winning: inside one thread's vector (columns 0 and 1) in row 0;
          // between threads, splits and against the scalar tail past the last whole vector in the
          // others. NaNs rank above every number, +inf included (a leading one in row 2, and
          // one after a +inf in row 3).
          if (cols > 1) logits[1] = logits[0] = 50.0f;
          for (int64_t r = 1; r < rows && cols > 9; ++r)
            logits[r * cols + 8] = logits[r * cols + valid - 1] = 60.0f;
          if (rows > 2 && cols > 9) logits[2 * cols] = logits[2 * cols + 9] = nan;
          if (rows > 3 && cols > 9) logits[3 * cols + 2] = INFINITY, logits[3 * cols + 5] = nan;
          DeviceArray d_logits(logits, dt);
          ArgmaxParams p{.rows = rows, .cols = cols, .valid_cols = valid, .split_cols = split_cols, .dtype = dt};
          const int64_t n = rows * p.splits();
          DeviceArray d_values(n, DType::kF32), d_columns(n, DType::kF32);
          p.logits = d_logits.get(), p.values = static_cast<float*>(d_values.get());
          p.columns = static_cast<int32_t*>(d_columns.get());
          cuda::argmax(p, stream_);
          sync();
          std::vector<float> want_values(static_cast<size_t>(n));
          std::vector<int32_t> want_columns(static_cast<size_t>(n)), got_columns(static_cast<size_t>(n));
          ArgmaxParams c = p;
          c.logits = logits.data(), c.values = want_values.data(), c.columns = want_columns.data();
          c.dtype = DType::kF32;
          cpu::argmax(c);
          LS_CHECK_CUDA(cudaMemcpy(got_columns.data(), d_columns.get(), static_cast<size_t>(n) * 4,
                                   cudaMemcpyDeviceToHost));
          const std::string what = "argmax " + label(rows, cols) + " split_cols=" + std::to_string(split_cols);
          EXPECT_EQ(got_columns, want_columns) << what << " " << dtype_name(dt);
          // Values are copies of logits: equal, NaN where the CPU's is.
          const std::vector<float> got_values = d_values.download();
          for (size_t i = 0; i < got_values.size(); ++i)
            if (std::isnan(want_values[i]))
              EXPECT_TRUE(std::isnan(got_values[i])) << what << " candidate " << i;
            else
              EXPECT_EQ(got_values[i], want_values[i]) << what << " candidate " << i;
        }
}

// next_tokens on the GPU against the CPU twin: candidates of three shares
// (the last one padding) with ties across shares, fewer and more candidates
// a row than a warp has lanes (5 and 33 splits), rows without a token (one
// of NaNs and -infs, one with a single NaN, one with a single +inf), feed back
// with a padding row and the context cap, and two calls alternating the
// published slot.
TEST_F(CudaOpTest, NextTokensMatchesCpu) {
  std::mt19937 rng(7);
  for (int64_t splits : {5, 33}) {
    for (int64_t rows : odd_rows()) {
      const int64_t shares = 3, share_cols = 200 * splits, vocab = 2 * share_cols;
      std::vector<float> candidates(static_cast<size_t>(shares * 2 * rows * splits));
      std::uniform_real_distribution<float> value(-2.0f, 2.0f);
      std::uniform_int_distribution<int32_t> column(-1, 199);
      for (int64_t s = 0; s < shares; ++s) {
        float* block = candidates.data() + s * 2 * rows * splits;
        for (int64_t i = 0; i < rows * splits; ++i) {
          block[i] = std::round(value(rng) * 2.0f) / 2.0f;  // few distinct values: ties
          const int32_t c = static_cast<int32_t>(i % splits) * 200 + column(rng);
          std::memcpy(&block[rows * splits + i], &c, 4);
        }
        // Rows without a token, published -1 and fed back as 0: row 1 (NaNs and -infs), row 2
        // (one NaN, in the second share), row 3 (one +inf, in the first).
        if (rows > 1)
          for (int64_t k = 0; k < splits; ++k)
            block[splits + k] = k % 2 == 0 ? std::numeric_limits<float>::quiet_NaN() : -INFINITY;
        const auto poison = [&](int64_t i, float v) {
          const int32_t c = static_cast<int32_t>(i % splits) * 200 + 5;  // a column: a candidate
          block[i] = v;
          std::memcpy(&block[rows * splits + i], &c, 4);
        };
        if (rows > 3 && s == 1) poison(2 * splits + splits - 1, std::numeric_limits<float>::quiet_NaN());
        if (rows > 3 && s == 0) poison(3 * splits, INFINITY);
      }
      std::vector<int32_t> slots(static_cast<size_t>(rows)), positions(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        slots[static_cast<size_t>(r)] = r % 5 == 4 ? 99 : static_cast<int32_t>(r);
        positions[static_cast<size_t>(r)] = static_cast<int32_t>(r % 3 == 0 ? 63 : r);
      }
      std::vector<int32_t> tokens(static_cast<size_t>(rows), 0), zero{0};
      DeviceArray d_candidates(candidates, DType::kF32), d_tokens(tokens), d_positions(positions), d_slots(slots),
          d_published(2 * rows, DType::kF32), d_count(zero);
      NextTokensParams p{.candidates = d_candidates.get(), .shares = shares, .splits = splits,
                         .share_cols = share_cols, .vocab = vocab, .rows = rows, .tokens = d_tokens.ints(),
                         .positions = d_positions.ints(), .slots = d_slots.ints(), .padding_slot = 99,
                         .max_position = 63, .published = d_published.ints(), .published_stride = rows,
                         .published_count = reinterpret_cast<uint32_t*>(d_count.ints())};
      std::vector<int32_t> want_published(static_cast<size_t>(2 * rows), 0);
      uint32_t want_count = 0;
      NextTokensParams c = p;
      c.candidates = candidates.data(), c.tokens = tokens.data(), c.positions = positions.data();
      c.slots = slots.data(), c.published = want_published.data(), c.published_count = &want_count;
      for (int call = 0; call < 2; ++call) {
        cuda::next_tokens(p, stream_);
        cpu::next_tokens(c);
      }
      sync();
      auto ints = [&](const DeviceArray& a, int64_t n) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        LS_CHECK_CUDA(cudaMemcpy(v.data(), a.get(), v.size() * 4, cudaMemcpyDeviceToHost));
        return v;
      };
      EXPECT_EQ(ints(d_published, 2 * rows), want_published) << "rows " << rows << " splits " << splits;
      if (rows > 3) {
        EXPECT_EQ(std::vector<int32_t>(want_published.begin() + 2, want_published.begin() + 4),
                  (std::vector<int32_t>{-1, -1}))
            << "a NaN or +inf candidate: no token";
      }
      EXPECT_EQ(ints(d_tokens, rows), tokens) << "rows " << rows << " splits " << splits;
      EXPECT_EQ(ints(d_positions, rows), positions) << "rows " << rows << " splits " << splits;
      EXPECT_EQ(static_cast<uint32_t>(ints(d_count, 1)[0]), want_count);
    }
  }
}

}  // namespace
}  // namespace lockstep
