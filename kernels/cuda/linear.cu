// Products of one or two rows (decode at batch 1 and 2) are memory-bound
// matrix-vector products: a kernel of our own streams W once with 16-byte
// loads, each warp owning one output feature and applying every W element to
// both rows. Every W vector costs one x vector load per row from L1, so more
// rows would make L1, not DRAM, the limit (measured: 8 rows ran at under a
// third of the copy bandwidth); larger products go to cuBLASLt.
//
// The GEMV also applies the op's SiLU·mul stage itself: the warp that
// computes a gate feature also computes its up feature and writes only the
// product, rounding gate and up to the storage type first as the unfused
// kernels do; that saves the silu_mul kernel. The input norm runs as its
// own kernel before the product. Staging the normed input in every block
// of the GEMV grid was measured slower than that kernel (H200, llama3-8b
// shapes: gate_up 69.7 us staged against 62.0 us plain, lm_head 297.6 against
// 249.4; benchmarks/NOTES.md).
//
// cuBLASLt in column-major terms: W [out, in] row-major is an [in, out]
// column-major matrix, so with A = W (transposed), B = x ([in, rows],
// leading dimension x_stride) and D = y ([out, rows]) the product is
// D = Aᵀ·B, m = out, n = rows, k = in. A bias is the BIAS epilogue.
#include "kernels/cuda/linear.h"

#include <algorithm>

#include "kernels/cuda/check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/ops.h"

namespace lockstep::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;
constexpr int kGemvMaxRows = 2;
constexpr int kGemvWarps = 8;

template <typename T>
struct GemvArgs {
  const T* x;
  int64_t x_stride;
  const T* w;
  const T* bias;
  T* y;
  int64_t in;
  int64_t out;
  // SiLU·mul: warp o computes features o and o + inter and writes act[r, o].
  T* act;
  int64_t inter;
};

// One warp's dot products acc[m][r] = x[r, :]·w_m[:] for M weight rows read
// together, the lanes striding over `in`. Each round has 4 KB of
// weights per warp in flight (unrolled over the row), which matters for the
// narrow products (4096 outputs: one warp each is too few loads in flight
// with less).
template <typename T, int M>
struct GemvRound {
  static constexpr int N = kVec16<T>;
  static constexpr int kUnroll = 4096 / (32 * 16 * M);
  static constexpr int64_t kElems = int64_t{kUnroll} * 32 * N;  // per warp
  Vec<T, N> w[M][kUnroll];

  // Whether the round at lane column c is a whole one.
  static __device__ bool whole(int64_t c, int64_t in) { return c + (kUnroll - 1) * 32 * N < in; }

  __device__ void load(const T* const (&rows)[M], int64_t c) {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) w[m][u] = load_streaming(rows[m] + c + u * 32 * N);
  }

  // Keeps the compiler from converting loaded weights to float before this
  // point (an opaque asm per register), so that a round loaded ahead of a
  // wait is held as 16-bit pairs, not twice the registers as floats.
  __device__ void hold() {
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        auto* words = reinterpret_cast<uint32_t*>(&w[m][u]);
#pragma unroll
        for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(words[i]));
      }
  }

  template <int R>
  __device__ void apply(const T* x, int64_t x_stride, int64_t c, float (&acc)[M][R]) const {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        Vec<T, N> xv;
        xv.load(x + r * x_stride + c + u * 32 * N);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int e = 0; e < N; ++e) acc[m][r] += w[m][u].get(e) * xv.get(e);
      }
  }
};

// The columns after the whole rounds, one vector per lane at a time, and
// the sums over the warp.
template <typename T, int R, int M>
__device__ void finish_dots(const T* x, int64_t x_stride, const T* const (&w)[M], int64_t c, int64_t in,
                            float (&acc)[M][R]) {
  constexpr int N = kVec16<T>;
  for (; c < in; c += 32 * N)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec<T, N> xv;
      xv.load(x + r * x_stride + c);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        const Vec<T, N> wv = load_streaming(w[m] + c);
#pragma unroll
        for (int e = 0; e < N; ++e) acc[m][r] += wv.get(e) * xv.get(e);
      }
    }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = warp_sum(acc[m][r]);
}

// y[r, o] = x[r, :]·W[o, :] (+ bias[o]) for r < R: warp w of block b owns
// output feature o = b·kGemvWarps + w (with SiLU·mul, features o and
// o + inter). The warp loads its first round of weights before it waits for
// the kernel that produces x: no kernel writes weights, and so the weight
// stream starts while the previous kernel finishes.
template <typename T, int R, bool kSilu>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvArgs<T> a) {
  constexpr int M = kSilu ? 2 : 1;
  using Round = GemvRound<T, M>;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  if (o >= (kSilu ? a.inter : a.out)) return;
  const T* w[M];
#pragma unroll
  for (int m = 0; m < M; ++m) w[m] = a.w + (o + m * a.inter) * a.in;
  float acc[M][R] = {};
  int64_t c = static_cast<int64_t>(threadIdx.x % 32) * Round::N;
  Round round;
  const bool first_whole = Round::whole(c, a.in);
  if (first_whole) round.load(w, c);
  start_after_producers();
  if (first_whole) {
    round.hold();
    round.apply(a.x, a.x_stride, c, acc);
    c += Round::kElems;
  }
  for (; Round::whole(c, a.in); c += Round::kElems) {
    round.load(w, c);
    round.apply(a.x, a.x_stride, c, acc);
  }
  finish_dots<T, R, M>(a.x, a.x_stride, w, c, a.in, acc);
  if (threadIdx.x % 32 != 0) return;
  const auto biased = [&](int m, int r) {
    return acc[m][r] + (a.bias != nullptr ? to_float(a.bias[o + m * a.inter]) : 0.0f);
  };
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if constexpr (kSilu) {
      const float gate = to_float(from_float<T>(biased(0, r)));
      const float up = to_float(from_float<T>(biased(1, r)));
      a.act[r * a.inter + o] = from_float<T>(silu_mul_value(gate, up));
    } else {
      a.y[r * a.out + o] = from_float<T>(biased(0, r));
    }
  }
}

// The GEMV path needs whole 16-byte vectors along every row.
bool gemv_fits(const LinearParams& p) {
  const int64_t n = 16 / static_cast<int64_t>(dtype_size(p.act_dtype));
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  return p.rows <= kGemvMaxRows && p.in_features % n == 0 && p.x_row_stride() % n == 0 && aligned(p.x) &&
         aligned(p.weight);
}

template <typename T>
void launch_gemv(const LinearParams& p, cudaStream_t stream) {
  const SiluMulParams* s = p.silu_mul ? &*p.silu_mul : nullptr;
  const GemvArgs<T> args{.x = static_cast<const T*>(p.x),
                         .x_stride = p.x_row_stride(),
                         .w = static_cast<const T*>(p.weight),
                         .bias = static_cast<const T*>(p.bias),
                         .y = static_cast<T*>(p.y),
                         .in = p.in_features,
                         .out = p.out_features,
                         .act = s ? static_cast<T*>(s->out) : nullptr,
                         .inter = s ? s->inter : 0};
  const dim3 grid(static_cast<unsigned>(ceil_div(s ? s->inter : p.out_features, kGemvWarps)));
  const auto go = [&](auto rows, auto silu) {
    LS_LAUNCH("gemv_kernel", (gemv_kernel<T, decltype(rows)::value, decltype(silu)::value>), grid,
              dim3(kGemvWarps * 32), 0, stream, args);
  };
  const auto with_silu = [&](auto rows) { s ? go(rows, std::true_type{}) : go(rows, std::false_type{}); };
  if (p.rows == 1)
    with_silu(std::integral_constant<int, 1>{});
  else
    with_silu(std::integral_constant<int, 2>{});
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
  }
  LS_FAIL(ErrorKind::kInternal, "linear: unsupported dtype");
}

int alignment(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  return v == 0 ? 256 : static_cast<int>(std::min<uintptr_t>(256, v & (~v + 1)));
}

}  // namespace

LinearContext::LinearContext() : workspace_bytes_(kWorkspaceBytes) {
  LS_CHECK_CUBLAS(cublasLtCreate(&handle_));
  LS_CHECK_CUDA(cudaMalloc(&workspace_, workspace_bytes_));
}

LinearContext::~LinearContext() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.op);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

const LinearContext::Plan& LinearContext::plan(const LinearParams& p) {
  const Key key{p.rows, p.in_features, p.out_features, p.x_row_stride(), static_cast<int>(p.act_dtype),
                p.bias != nullptr, alignment(p.x), alignment(p.weight), alignment(p.y)};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  Plan plan;
  const cudaDataType_t type = cuda_type(p.act_dtype);
  LS_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T;
  LS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  if (p.bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    LS_CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  }
  const auto rows = static_cast<uint64_t>(p.rows);
  const auto in = static_cast<uint64_t>(p.in_features);
  const auto out = static_cast<uint64_t>(p.out_features);
  LS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a, type, in, out, static_cast<int64_t>(in)));
  LS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.b, type, in, rows, p.x_row_stride()));
  LS_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.d, type, out, rows, static_cast<int64_t>(out)));
  cublasLtMatmulPreference_t pref;
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
  const uint32_t align_a = static_cast<uint32_t>(std::get<7>(key));
  const uint32_t align_b = static_cast<uint32_t>(std::get<6>(key));
  const uint32_t align_d = static_cast<uint32_t>(std::get<8>(key));
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes_, sizeof(workspace_bytes_)));
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                       sizeof(align_a)));
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                       sizeof(align_b)));
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                       sizeof(align_d)));
  LS_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                       sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.d, plan.d,
                                                               pref, 1, &result, &found_count);
  cublasLtMatmulPreferenceDestroy(pref);
  LS_REQUIRE(status == CUBLAS_STATUS_SUCCESS && found_count > 0, ErrorKind::kCublas,
             "cuBLASLt has no algorithm for linear rows={} in={} out={} dtype={} ({})", p.rows, p.in_features,
             p.out_features, dtype_name(p.act_dtype), cublasGetStatusString(status));
  plan.algo = result.algo;
  return plans_.emplace(key, plan).first->second;
}

void linear(const LinearParams& p, LinearContext& ctx, cudaStream_t stream) {
  p.validate();
  LS_OP_REQUIRE(p.act_dtype == p.weight_dtype, "linear", "activations ({}) and weights ({}) must share a dtype",
                dtype_name(p.act_dtype), dtype_name(p.weight_dtype));
  if (p.rows == 0) return;
  if (p.input_norm) rms_norm(*p.input_norm, stream);
  if (gemv_fits(p)) {
    dispatch_dtype(p.act_dtype, "linear", [&](auto t) { launch_gemv<decltype(t)>(p, stream); });
    return;
  }
  const LinearContext::Plan& plan = ctx.plan(p);
  if (p.bias != nullptr)
    LS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias,
                                                   sizeof(p.bias)));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  LS_CHECK_CUBLAS(cublasLtMatmul(ctx.handle(), plan.op, &alpha, p.weight, plan.a, p.x, plan.b, &beta, p.y, plan.d,
                                 p.y, plan.d, &plan.algo, ctx.workspace(), ctx.workspace_bytes(), stream));
  if (p.silu_mul) silu_mul(*p.silu_mul, stream);
}

}  // namespace lockstep::cuda
