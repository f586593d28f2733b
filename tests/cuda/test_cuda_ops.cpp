// The elementwise, normalization, rotary and linear CUDA ops against the
// float32 CPU reference on odd sizes, in every dtype (tolerances in
// cuda_test_support.h).
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
                          .hidden = hidden, .row_begin = row_begin, .rows_local = rows_local, .dtype = dt};
        cuda::embedding(p, stream_);
        sync();
        std::vector<float> want(static_cast<size_t>(tokens * hidden));
        EmbeddingParams c = p;
        c.ids = ids.data(), c.table = table.data(), c.out = want.data(), c.dtype = DType::kF32;
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
          std::vector<float> x = random_values(rows * cols, dt, rng);
          std::vector<float> res = random_values(rows * cols, dt, rng, 4.0f);
          std::vector<float> w = random_values(cols, dt, rng);
          DeviceArray d_x(x, dt), d_res(res, dt), d_w(w, dt), d_out(rows * cols, dt);
          RmsNormParams p{.x = d_x.get(), .residual = fused ? d_res.get() : nullptr,
                          .residual_out = fused ? d_res.get() : nullptr, .weight = d_w.get(), .out = d_out.get(),
                          .rows = rows, .cols = cols, .eps = 1e-6f, .dtype = dt};
          cuda::rms_norm(p, stream_);
          sync();
          std::vector<float> want(x.size());
          RmsNormParams c = p;
          c.x = x.data(), c.residual = fused ? res.data() : nullptr, c.residual_out = fused ? res.data() : nullptr;
          c.weight = w.data(), c.out = want.data(), c.dtype = DType::kF32;
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
                                    {10, 2, 64, true, RopeType::kLlama3}, {16, 2, 128, false, RopeType::kLlama3},
                                    {8, 1, 256, true, RopeType::kDefault}};
  for (DType dt : all_dtypes())
    for (int64_t tokens : odd_rows())
      for (const RopeCase& rc : cases) {
        RopeConfig rope{.type = rc.rope, .theta = 500000.0, .factor = 8.0, .low_freq_factor = 1.0,
                        .high_freq_factor = 4.0, .original_max_position = 8192};
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
                           .dtype = dt};
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

TEST_F(CudaOpTest, ArgmaxMatchesCpu) {
  std::mt19937 rng(6);
  for (DType dt : all_dtypes())
    for (int64_t rows : odd_rows())
      for (int64_t cols : {1, 111, 32000}) {
        std::vector<float> logits = random_values(rows * cols, dt, rng);
        if (cols > 1) logits[1] = logits[0] = 50.0f;  // a tie: the lower column wins
        const int64_t valid = std::max<int64_t>(1, cols - 3);
        DeviceArray d_logits(logits, dt), d_values(rows, DType::kF32), d_columns(rows, DType::kF32);
        ArgmaxParams p{.logits = d_logits.get(), .values = static_cast<float*>(d_values.get()),
                       .columns = static_cast<int32_t*>(d_columns.get()), .rows = rows, .cols = cols,
                       .valid_cols = valid, .dtype = dt};
        cuda::argmax(p, stream_);
        sync();
        std::vector<float> want_values(static_cast<size_t>(rows));
        std::vector<int32_t> want_columns(static_cast<size_t>(rows)), got_columns(static_cast<size_t>(rows));
        ArgmaxParams c = p;
        c.logits = logits.data(), c.values = want_values.data(), c.columns = want_columns.data();
        c.dtype = DType::kF32;
        cpu::argmax(c);
        LS_CHECK_CUDA(cudaMemcpy(got_columns.data(), d_columns.get(), static_cast<size_t>(rows) * 4,
                                 cudaMemcpyDeviceToHost));
        EXPECT_EQ(got_columns, want_columns) << "argmax " << label(rows, cols) << " " << dtype_name(dt);
        expect_close(d_values.download(), want_values, DType::kF32, "argmax values " + label(rows, cols));
      }
}

}  // namespace
}  // namespace lockstep
