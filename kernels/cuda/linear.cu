// Products of one or two rows (decode at batch 1 and 2) are memory-bound
// matrix-vector products: a kernel of our own streams W once with 16-byte
// loads, each warp owning one output feature and applying every W element to
// both rows. Every W vector costs one x vector load per row from L1, so more
// rows would make L1, not DRAM, the limit (measured: 8 rows ran at under a
// third of the copy bandwidth); larger products go to cuBLASLt.
//
// The GEMV also runs the op's optional stages itself, which saves a kernel
// boundary each (about 5 us at batch 1, measured as the step time outside
// the products): the input RMSNorm is computed by every block into shared
// memory before the product (block 0 writes the new residual), and SiLU·mul
// is applied by the warp that computes both a gate and its up feature. The
// rounding matches the unfused kernels: the residual sum and the normed
// input are rounded to the storage type, as are gate and up before SiLU·mul.
// Elsewhere the stages run as their own kernels around cuBLASLt.
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
// With the norm staged, each block loops over outputs: up to this many
// resident blocks per SM keep enough loads in flight while the staging is
// paid once per block.
constexpr int kGemvStagedBlocksPerSm = 4;
constexpr int64_t kGemvMaxStagedBytes = 48 << 10;  // the default dynamic shared memory limit
constexpr int64_t kGemvPrefetchBytes = 4 << 10;

template <typename T>
struct GemvArgs {
  const T* x;  // unused when the norm is staged
  int64_t x_stride;
  const T* w;
  const T* bias;
  T* y;
  int64_t in;
  int64_t out;
  // Staged input norm: x = rms_norm(norm_x (+ residual)) · norm_weight.
  const T* norm_x;
  const T* residual;
  T* residual_out;  // written by block 0; null: not kept
  const T* norm_weight;
  float eps;
  // SiLU·mul: warp o computes features o and o + inter and writes act[r, o].
  T* act;
  int64_t inter;
};

// Every block computes the normed rows [R, in] into `staged`, as the
// rms_norm kernel does.
template <typename T, int R>
__device__ void stage_normed_input(const GemvArgs<T>& a, T* staged) {
  constexpr int N = kVec16<T>;
  float sq[R] = {};
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * N; c < a.in; c += static_cast<int64_t>(blockDim.x) * N) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec<T, N> v;
      v.load(a.norm_x + r * a.in + c);
      if (a.residual != nullptr) {
        Vec<T, N> res;
        res.load(a.residual + r * a.in + c);
#pragma unroll
        for (int i = 0; i < N; ++i) v.set(i, v.get(i) + res.get(i));
        if (a.residual_out != nullptr && blockIdx.x == 0) v.store(a.residual_out + r * a.in + c);
      }
#pragma unroll
      for (int i = 0; i < N; ++i) sq[r] += v.get(i) * v.get(i);
      v.store(staged + r * a.in + c);
    }
  }
  float inv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) inv[r] = rsqrtf(block_sum(sq[r]) / static_cast<float>(a.in) + a.eps);
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * N; c < a.in; c += static_cast<int64_t>(blockDim.x) * N) {
    Vec<T, N> w;
    w.load(a.norm_weight + c);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec<T, N> v;
      v.load(staged + r * a.in + c);
#pragma unroll
      for (int i = 0; i < N; ++i) v.set(i, v.get(i) * inv[r] * w.get(i));
      v.store(staged + r * a.in + c);
    }
  }
  __syncthreads();
}

// acc[m][r] = x[r, :]·w_m[:] over one warp (lanes stride over `in`), for M
// weight rows read together so that their loads are in flight at once.
template <typename T, int R, int M>
__device__ __forceinline__ void warp_dots(const T* x, int64_t x_stride, const T* const (&w)[M], int64_t in,
                                          float (&acc)[M][R]) {
  constexpr int N = kVec16<T>;
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x % 32;
  int64_t c = static_cast<int64_t>(lane) * N;
  for (; c + (kUnroll - 1) * 32 * N < in; c += kUnroll * 32 * N) {
    Vec<T, N> wv[M][kUnroll];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) wv[m][u].load(w[m] + c + u * 32 * N);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        Vec<T, N> xv;
        xv.load(x + r * x_stride + c + u * 32 * N);
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int e = 0; e < N; ++e) acc[m][r] += wv[m][u].get(e) * xv.get(e);
      }
  }
  for (; c < in; c += 32 * N)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      Vec<T, N> xv;
      xv.load(x + r * x_stride + c);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        Vec<T, N> wv;
        wv.load(w[m] + c);
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
// output features o = (b + k·gridDim)·kGemvWarps + w.
template <typename T, int R, bool kNorm, bool kSilu>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvArgs<T> a) {
  extern __shared__ __align__(16) unsigned char staged_bytes[];
  constexpr int M = kSilu ? 2 : 1;
  const int64_t units = kSilu ? a.inter : a.out;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  // The weights depend on no earlier kernel: while it finishes, L2 fetches
  // the start of this warp's first rows (at most kGemvPrefetchBytes each, so
  // that a grid's prefetches stay well inside L2).
  if (first < units) {
    const int64_t row_bytes = a.in * static_cast<int64_t>(sizeof(T));
    const int64_t bytes = row_bytes < kGemvPrefetchBytes ? row_bytes : kGemvPrefetchBytes;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const char* row = reinterpret_cast<const char*>(a.w + (first + m * a.inter) * a.in);
      for (int64_t b = (threadIdx.x % 32) * 128; b < bytes; b += 32 * 128) prefetch_l2(row + b);
    }
  }
  start_after_producers();
  const T* x = a.x;
  int64_t x_stride = a.x_stride;
  if constexpr (kNorm) {
    T* staged = reinterpret_cast<T*>(staged_bytes);
    stage_normed_input<T, R>(a, staged);
    x = staged;
    x_stride = a.in;
  }
  const bool writer = threadIdx.x % 32 == 0;
  for (int64_t o = first; o < units; o += static_cast<int64_t>(gridDim.x) * kGemvWarps) {
    const T* w[M];
    float acc[M][R] = {};
#pragma unroll
    for (int m = 0; m < M; ++m) w[m] = a.w + (o + m * a.inter) * a.in;
    warp_dots<T, R, M>(x, x_stride, w, a.in, acc);
    if (!writer) continue;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (kSilu) {
        const float gate = to_float(from_float<T>(acc[0][r] + (a.bias != nullptr ? to_float(a.bias[o]) : 0.0f)));
        const float up =
            to_float(from_float<T>(acc[1][r] + (a.bias != nullptr ? to_float(a.bias[o + a.inter]) : 0.0f)));
        a.act[r * a.inter + o] = from_float<T>(silu_mul_value(gate, up));
      } else {
        a.y[r * a.out + o] = from_float<T>(acc[0][r] + (a.bias != nullptr ? to_float(a.bias[o]) : 0.0f));
      }
    }
  }
}

// The GEMV path needs whole 16-byte vectors along every row.
bool gemv_fits(const LinearParams& p) {
  const int64_t n = 16 / static_cast<int64_t>(dtype_size(p.act_dtype));
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  bool fits = p.rows <= kGemvMaxRows && p.in_features % n == 0 && p.x_row_stride() % n == 0 && aligned(p.x) &&
              aligned(p.weight);
  if (p.input_norm) fits = fits && aligned(p.input_norm->x) && aligned(p.input_norm->weight) &&
                           (!p.input_norm->residual || aligned(p.input_norm->residual)) &&
                           (!p.input_norm->residual_out || aligned(p.input_norm->residual_out));
  return fits;
}

int64_t staged_input_bytes(const LinearParams& p) {
  return p.rows * p.in_features * static_cast<int64_t>(dtype_size(p.act_dtype));
}

template <typename T>
void launch_gemv(const LinearParams& p, bool stage_norm, int num_sms, cudaStream_t stream) {
  const RmsNormParams* n = stage_norm ? &*p.input_norm : nullptr;
  const SiluMulParams* s = p.silu_mul ? &*p.silu_mul : nullptr;
  const GemvArgs<T> args{.x = static_cast<const T*>(p.x),
                         .x_stride = p.x_row_stride(),
                         .w = static_cast<const T*>(p.weight),
                         .bias = static_cast<const T*>(p.bias),
                         .y = static_cast<T*>(p.y),
                         .in = p.in_features,
                         .out = p.out_features,
                         .norm_x = n ? static_cast<const T*>(n->x) : nullptr,
                         .residual = n ? static_cast<const T*>(n->residual) : nullptr,
                         .residual_out = n ? static_cast<T*>(n->residual_out) : nullptr,
                         .norm_weight = n ? static_cast<const T*>(n->weight) : nullptr,
                         .eps = n ? n->eps : 0.0f,
                         .act = s ? static_cast<T*>(s->out) : nullptr,
                         .inter = s ? s->inter : 0};
  const int64_t units = s ? s->inter : p.out_features;
  const size_t smem = stage_norm ? static_cast<size_t>(staged_input_bytes(p)) : 0;
  const auto go = [&](auto rows, auto norm, auto silu) {
    const auto kernel = gemv_kernel<T, decltype(rows)::value, decltype(norm)::value, decltype(silu)::value>;
    int64_t blocks = ceil_div(units, kGemvWarps);
    if (stage_norm) {  // one wave of resident blocks, each looping over outputs
      int per_sm = 0;
      LS_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvWarps * 32, smem));
      blocks = std::min<int64_t>(blocks, static_cast<int64_t>(num_sms) * std::clamp(per_sm, 1, kGemvStagedBlocksPerSm));
    }
    LS_LAUNCH("gemv_kernel", kernel, dim3(static_cast<unsigned>(blocks)), dim3(kGemvWarps * 32), smem, stream, args);
  };
  const auto with_stages = [&](auto rows) {
    using B0 = std::false_type;
    using B1 = std::true_type;
    if (stage_norm)
      s ? go(rows, B1{}, B1{}) : go(rows, B1{}, B0{});
    else
      s ? go(rows, B0{}, B1{}) : go(rows, B0{}, B0{});
  };
  if (p.rows == 1)
    with_stages(std::integral_constant<int, 1>{});
  else
    with_stages(std::integral_constant<int, 2>{});
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
  int device = 0;
  LS_CHECK_CUDA(cudaGetDevice(&device));
  LS_CHECK_CUDA(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
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
  const bool gemv = gemv_fits(p);
  const bool stage_norm = gemv && p.input_norm && staged_input_bytes(p) <= kGemvMaxStagedBytes;
  if (p.input_norm && !stage_norm) rms_norm(*p.input_norm, stream);
  if (gemv) {
    dispatch_dtype(p.act_dtype, "linear",
                   [&](auto t) { launch_gemv<decltype(t)>(p, stage_norm, ctx.num_sms(), stream); });
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
