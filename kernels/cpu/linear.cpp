#include "kernels/linear.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/cpu_common.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/silu_mul.h"

namespace lockstep::cpu {

namespace {

constexpr int64_t kScratchPad = 16;  // floats between widened rows (below)

// The products' tile: input rows x weight rows, each output one cpu::dot.
// AVX-512's 32 registers hold 4 x 8 (dot_tile_avx512), AVX2's 16 and the
// generic vectors 2 x 4. Weight: the element type the tile reads (16-bit
// rows are widened to float32 scratch first unless it reads them as they are).
struct Tile2x4 {
  static constexpr int kRows = 2, kFeatures = 4;
  using Weight = float;
  static void dot(const float* const* x, const float* const* w, int64_t n, float* out) {
    dot_tile_fastest<kRows, kFeatures>(x, w, n, out);
  }
};
#if defined(__x86_64__)
// Without AVX-512, AVX2's 2 x 4 tile reads 16-bit weights as they are up to
// these row counts, past which the widening pass through scratch is cheaper
// (cpu_linear_bench 4096 x 14336, 2 EPYC threads with AVX-512 left unused:
// bf16 2 rows 3.8 ms against 6.8, 4 rows 6.4-6.7 against 8.2-9.0, 6 rows 9.4
// against 10.7, 8 even, 16 21.6 against 16.0; f16 2 rows 3.5 against 6.1,
// 16 rows 12.6-12.9 against 14.9-15.1, 64 even; on an 896 x 4864 product
// that stays in cache f16 is ahead up to 8 rows and 3-5% behind at 32-128).
constexpr int64_t kAvx2Bf16Rows = 6;
constexpr int64_t kAvx2F16Rows = 16;
template <typename W>
struct Avx2Tile2x4 {
  static constexpr int kRows = 2, kFeatures = 4;
  using Weight = W;
  static void dot(const float* const* x, const W* const* w, int64_t n, float* out) {
    dot_tile_avx2<kRows, kFeatures>(x, w, n, out);
  }
};
template <int Rows, int Features, typename W>
struct Avx512Tile {
  static constexpr int kRows = Rows, kFeatures = Features;
  using Weight = W;
  static void dot(const float* const* x, const W* const* w, int64_t n, float* out) {
    dot_tile_avx512<kRows, kFeatures / 2>(x, w, n, out);
  }
};
// Up to 8 rows, bf16 weights widened in registers beat a widening pass
// through scratch: each weight is read by one or two tiles, too few to pay
// for the pass (cpu_linear_bench 896 x 38912, one EPYC core: 2 rows 5.7 ms
// against 8.1, 8 rows in one 8 x 4 tile 7.6 against 12.7; 16 rows 18.0
// against 16.3).
using Bf16Tile4x8 = Avx512Tile<4, 8, uint16_t>;
using Bf16Tile8x4 = Avx512Tile<8, 4, uint16_t>;
// f16 likewise, widened by vcvtph2ps.
using F16Tile4x8 = Avx512Tile<4, 8, F16Bits>;
using F16Tile8x4 = Avx512Tile<8, 4, F16Bits>;
// One f16 row against 8 weight rows at once (cpu_linear_bench 4096 x 14336,
// 2 threads: 2.0-2.7 ms against 5.7 widened through scratch; RESULTS.md).
// bf16 and float32 rows stay one dot product at a time: the same tile was
// no faster from DRAM for bf16 and slower for float32.
using F16Tile1x8 = Avx512Tile<1, 8, F16Bits>;
#endif

// y[r, o0 + f] = x_r · w_f + bias for every row r of p's x and the
// `features` (1 to Tile::kFeatures) weight rows w from output feature o0
// (padded with repeats), a tile at a time; a short last tile repeats a row
// and drops its outputs.
template <typename Tile>
void tile_products(const LinearParams& p, const typename Tile::Weight* const* w, int64_t o0, int features) {
  const auto* x = static_cast<const float*>(p.x);
  const auto* bias = static_cast<const float*>(p.bias);
  auto* y = static_cast<float*>(p.y) + o0;
  for (int64_t r = 0; r < p.rows; r += Tile::kRows) {
    const float* xr[Tile::kRows];
    for (int i = 0; i < Tile::kRows; ++i) xr[i] = x + std::min(r + i, p.rows - 1) * p.x_row_stride();
    float out[Tile::kRows * Tile::kFeatures];
    Tile::dot(xr, w, p.in_features, out);
    for (int64_t i = 0; i < std::min<int64_t>(Tile::kRows, p.rows - r); ++i)
      for (int f = 0; f < features; ++f)
        y[(r + i) * p.out_features + f] = out[i * Tile::kFeatures + f] + (bias != nullptr ? bias[o0 + f] : 0.0f);
  }
}

// One row against float32 or bf16 weights (widened inside the dot product):
// one sequential pass over the weights, which bounds decode at batch 1. A
// tile reading four weight rows at once ran 1.1-2x slower from DRAM, and an
// AVX2 dot no faster (bf16 was measured 1.3x faster widened in the dot than
// a row at a time first). f16 goes through the tiles: F16C widens a row to
// scratch 2.5x faster than a dot can widen it element by element.
void one_row_products(const LinearParams& p) {
  const auto* x = static_cast<const float*>(p.x);
  const auto* bias = static_cast<const float*>(p.bias);
  auto* y = static_cast<float*>(p.y);
  const int64_t n = p.in_features;
  const bool bf16 = p.weight_dtype == DType::kBF16;
  [[maybe_unused]] const bool parallel = p.out_features * n >= (int64_t{1} << 16);
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t o = 0; o < p.out_features; ++o) {
    const float d = bf16 ? dot_bf16(x, static_cast<const uint16_t*>(p.weight) + o * n, n)
                         : dot(x, static_cast<const float*>(p.weight) + o * n, n);
    y[o] = d + (bias != nullptr ? bias[o] : 0.0f);
  }
}

// Every other product: blocks of Tile::kFeatures weight rows (widened into
// float32 scratch if 16-bit and the tile reads float32, exactly) against all
// input rows, a tile at a time.
template <typename Tile>
void tiled_products(const LinearParams& p) {
  constexpr int kFeatures = Tile::kFeatures;
  using Weight = typename Tile::Weight;
  const auto* w = static_cast<const uint8_t*>(p.weight);
  const int64_t n = p.in_features;
  const int64_t row_bytes = n * static_cast<int64_t>(dtype_size(p.weight_dtype));
  const bool widens = p.weight_dtype != DType::kF32 && std::is_same_v<Weight, float>;
  const int64_t blocks = (p.out_features + kFeatures - 1) / kFeatures;
  [[maybe_unused]] const bool parallel = p.out_features * n * p.rows >= (int64_t{1} << 16);
#pragma omp parallel if (parallel)
  {
    // Widened rows a pitch of 64 bytes more than a row apart, so that rows
    // whose length is a multiple of 4 KB do not share cache sets (measured
    // ~8% faster at 2048 features).
    const int64_t pitch = n + kScratchPad;
    float* widened = widens ? thread_scratch<float, kWidenedRow>(static_cast<size_t>(kFeatures * pitch)) : nullptr;
#pragma omp for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t o0 = block * kFeatures;
      const int features = static_cast<int>(std::min<int64_t>(kFeatures, p.out_features - o0));
      const Weight* wr[kFeatures];
      for (int f = 0; f < kFeatures; ++f) {
        const int source = std::min(f, features - 1);  // a short block repeats its last row
        const uint8_t* stored = w + (o0 + source) * row_bytes;
        if constexpr (std::is_same_v<Weight, float>) {
          if (widens && f == source) convert_to_f32(stored, p.weight_dtype, widened + f * pitch, static_cast<size_t>(n));
          wr[f] = widens ? widened + source * pitch : reinterpret_cast<const float*>(stored);
        } else {
          wr[f] = reinterpret_cast<const Weight*>(stored);
        }
      }
      tile_products<Tile>(p, wr, o0, features);
    }
  }
}

void tiled_products(const LinearParams& p) {
#if defined(__x86_64__)
  if (has_avx512()) {
    if (p.weight_dtype == DType::kF16 && p.rows == 1) return tiled_products<F16Tile1x8>(p);
    if (p.weight_dtype == DType::kBF16 && p.rows <= 4) return tiled_products<Bf16Tile4x8>(p);
    if (p.weight_dtype == DType::kBF16 && p.rows <= 8) return tiled_products<Bf16Tile8x4>(p);
    if (p.weight_dtype == DType::kF16 && p.rows <= 4) return tiled_products<F16Tile4x8>(p);
    if (p.weight_dtype == DType::kF16 && p.rows <= 8) return tiled_products<F16Tile8x4>(p);
    return tiled_products<Avx512Tile<4, 8, float>>(p);
  }
  if (has_avx2() && p.weight_dtype == DType::kBF16 && p.rows <= kAvx2Bf16Rows)
    return tiled_products<Avx2Tile2x4<uint16_t>>(p);
  if (has_avx2() && has_f16c() && p.weight_dtype == DType::kF16 && p.rows <= kAvx2F16Rows)
    return tiled_products<Avx2Tile2x4<F16Bits>>(p);
#endif
  tiled_products<Tile2x4>(p);
}

// input_rms and residual after the products: y[r, :] times x[r, :]'s inverse RMS (float64 sum of
// squares), plus the bias (which the products then left out), plus the residual row.
void scale_and_add_rows(const LinearParams& p) {
  const auto* x = static_cast<const float*>(p.x);
  const auto* bias = static_cast<const float*>(p.bias);
  const auto* residual = static_cast<const float*>(p.residual);
  auto* y = static_cast<float*>(p.y);
  for (int64_t r = 0; r < p.rows; ++r) {
    float* row = y + r * p.out_features;
    if (p.input_rms) {
      const float* xr = x + r * p.in_features;
      double sq = 0.0;
      for (int64_t i = 0; i < p.in_features; ++i) sq += static_cast<double>(xr[i]) * xr[i];
      const auto inv = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(p.in_features) + p.input_rms->eps));
      for (int64_t o = 0; o < p.out_features; ++o) row[o] = row[o] * inv + (bias != nullptr ? bias[o] : 0.0f);
    }
    if (residual != nullptr)
      for (int64_t o = 0; o < p.out_features; ++o) row[o] += residual[r * p.out_features + o];
  }
}

}  // namespace

// Each output is one dot product (cpu::dot's eight partial sums, in its
// order), whatever the batch, thread count or instruction set, so results
// never depend on them. Features are split over the CPU threads
// (kernels/cpu_threads.h) when the product is large enough to pay for them.
// One row against float32 or bf16 weights streams them once; every other
// product widens blocks of 4 weight rows (8 with AVX-512) to float32
// (exactly) and runs them against 2 input rows (4) at a time, each loaded
// vector used 2 or 4 times (4 or 8) (benchmarks/cpu_linear_bench, 2 EPYC
// cores, bf16 2048 x 2048: AVX2 2.1-2.6x faster than one dot at a time at
// 8 to 128 rows, AVX-512 another ~2x; benchmarks/RESULTS.md); with AVX-512,
// up to 8 rows read bf16 and f16 weights as they are, with AVX2 alone up to
// 6 (bf16) and 16 (f16). The optional
// stages run as their own ops, before and after.
void linear(const LinearParams& p) {
  p.validate();
  if (p.input_norm) rms_norm(*p.input_norm);
  require_f32(p.act_dtype, "linear");
  // With input_rms the bias comes after the rows' scale, so the products leave it out.
  LinearParams product = p;
  if (p.input_rms) product.bias = nullptr;
  if (p.rows == 1 && p.weight_dtype != DType::kF16) {
    one_row_products(product);
  } else {
    tiled_products(product);
  }
  if (p.input_rms || p.residual) scale_and_add_rows(p);
  if (p.silu_mul) silu_mul(*p.silu_mul);
  if (p.qk_norm_rope) qk_norm_rope(*p.qk_norm_rope);
}

}  // namespace lockstep::cpu
