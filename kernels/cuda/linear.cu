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
// kernels do; that saves the silu_mul kernel. Likewise RoPE with the KV
// append (models without q/k norm): a block computes four rotation pairs
// (features i and i + head_dim/2 of a head) in its eight warps, rotates the
// rounded values as the rope kernel does and writes them to y and the
// cache, which saves the rope kernel at batch 1-2. The input norm runs as its
// own kernel before the product; so does the scale of a folded input norm
// (LinearParams::input_rms: a norm kernel with no weight, into scratch), and
// the GEMV adds LinearParams::residual in its epilogue. Larger products with
// input_rms leave the scale and the bias to the output stage's kernel, up to
// kNormFirstRows rows; from there the rows are normed into the op's scratch
// first, as for the GEMV.
// Staging the normed input in every block of the GEMV grid was measured
// slower than that kernel (H200, llama3-8b shapes: gate_up 69.7 us staged
// against 62.0 us plain, lm_head 297.6 against 249.4; benchmarks/NOTES.md).
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
// The GEMV's rows scaled for a folded input norm: 2 rows of 65536 float32.
constexpr size_t kNormedBytes = 2 * 65536 * 4;
constexpr int kGemvMaxRows = 2;
// From this many rows, a folded input norm with scratch (InputRms::normed)
// writes the normed rows first and runs the plain product and stage: at 2048
// rows of llama3-8b the scaled stages (every block computing its row's scale)
// took 166.6 us a layer, the two norms and plain stages 142.8 (H100,
// benchmarks/RESULTS.md); decode batches (up to 64 rows) keep the scaled stages.
constexpr int64_t kNormFirstRows = 128;
constexpr int kGemvWarps = 8;

// What the kernel does with its dot products.
enum class GemvOut { kPlain, kSiluMul, kRope };

// The fused RoPE and KV append of the QKV rows (no q/k norm).
template <typename T>
struct GemvRope {
  const int32_t* positions;
  const float* inv_freq;  // [head_dim / 2]
  float cos_sin_scale;
  const int32_t* slots;   // null: no KV append
  T* k_cache;
  T* v_cache;
  int64_t slot_stride;
  int64_t position_stride;
  int64_t head_stride;
  int head_dim;  // a multiple of 8: a block's four pairs lie in one head
  int num_heads;
  int num_kv_heads;
};

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
  GemvRope<T> rope;
  // Whether the first round of weights is loaded before the wait for x's
  // producer: not when that producer is the op's input norm (see gemv_kernel).
  bool load_before_wait;
  const T* residual;  // LinearParams::residual or null (plain output only)
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

// The output feature of this warp: o = b·kGemvWarps + w for warp w of
// block b, except with RoPE, where block b holds rotation pairs 4b .. 4b + 3
// (pair j of head h: features h·head_dim + j and h·head_dim + j + head_dim/2),
// warps 0-3 their first features and warps 4-7 the partners.
template <typename T, GemvOut E>
__device__ int64_t gemv_feature(const GemvArgs<T>& a) {
  const int warp = static_cast<int>(threadIdx.x / 32);
  if constexpr (E == GemvOut::kRope) {
    const int half = a.rope.head_dim / 2;
    const int64_t pair = static_cast<int64_t>(blockIdx.x) * 4 + warp % 4;
    return pair / half * a.rope.head_dim + pair % half + warp / 4 * half;
  } else {
    return static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  }
}

// RoPE's output: every warp's (biased, rounded) values through shared
// memory, then lane r of warps 0-3 rotates row r's pair as the rope kernel
// does (angle in double precision, rotation in float32, q and k heads only)
// and writes it to y and, for k and v heads, to the cache.
template <typename T, int R>
__device__ void gemv_rope_out(const GemvArgs<T>& a, int64_t o, const float (&acc)[1][R]) {
  static_assert(R <= 2, "lane r < R picks row r's sum below");
  __shared__ float value[kGemvWarps][R];
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const float bias = a.bias != nullptr ? to_float(a.bias[o]) : 0.0f;
  if (lane < R) value[warp][lane] = to_float(from_float<T>((lane == 0 ? acc[0][0] : acc[0][R - 1]) + bias));
  __syncthreads();
  if (warp >= 4 || lane >= R) return;
  const GemvRope<T>& rp = a.rope;
  const int half = rp.head_dim / 2;
  const int64_t head = o / rp.head_dim;
  const int64_t pair = o % rp.head_dim;
  const int32_t position = rp.positions[lane];
  const float x1 = value[warp][lane], x2 = value[warp + 4][lane];
  T r1 = from_float<T>(x1), r2 = from_float<T>(x2);
  if (head < rp.num_heads + rp.num_kv_heads) {
    double s, c;
    sincos(static_cast<double>(position) * static_cast<double>(rp.inv_freq[pair]), &s, &c);
    const float cs = static_cast<float>(c) * rp.cos_sin_scale, sn = static_cast<float>(s) * rp.cos_sin_scale;
    r1 = from_float<T>(x1 * cs - x2 * sn);
    r2 = from_float<T>(x2 * cs + x1 * sn);
  }
  T* y = a.y + lane * a.out + o;
  y[0] = r1, y[half] = r2;
  if (rp.slots == nullptr || head < rp.num_heads) return;
  const bool is_k = head < rp.num_heads + rp.num_kv_heads;
  const int64_t kv_head = head - rp.num_heads - (is_k ? 0 : rp.num_kv_heads);
  T* dst = (is_k ? rp.k_cache : rp.v_cache) + rp.slots[lane] * rp.slot_stride + position * rp.position_stride +
           kv_head * rp.head_stride + pair;
  dst[0] = r1, dst[half] = r2;
}

// y[r, o] = x[r, :]·W[o, :] (+ bias[o]) for r < R, warp by warp (see
// gemv_feature; with SiLU·mul, features o and o + inter). The warp loads its
// first round of weights before it waits for the kernel that produces x (no
// kernel writes weights, and so the weight stream starts while the previous
// kernel finishes), except after the op's input norm: the norm is a chain
// of dependent round trips to memory, and weight loads queued in front of
// them cost it more than they save (measured on the H200, llama3-8b at batch
// 1: 4.159 ms a step loading after the norm's end, 4.222-4.228 before;
// benchmarks/NOTES.md). The GEMV still launches early, so its blocks are
// resident when the norm ends.
template <typename T, int R, GemvOut E>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(GemvArgs<T> a) {
  constexpr int M = E == GemvOut::kSiluMul ? 2 : 1;
  using Round = GemvRound<T, M>;
  const int64_t o = gemv_feature<T, E>(a);
  if (o >= (E == GemvOut::kSiluMul ? a.inter : a.out)) return;  // never with RoPE: its grid is exact
  const T* w[M];
#pragma unroll
  for (int m = 0; m < M; ++m) w[m] = a.w + (o + m * a.inter) * a.in;
  float acc[M][R] = {};
  int64_t c = static_cast<int64_t>(threadIdx.x % 32) * Round::N;
  Round round;
  const bool first_whole = Round::whole(c, a.in);
  if (first_whole && a.load_before_wait) round.load(w, c);
  start_after_producers();
  if (first_whole && !a.load_before_wait) round.load(w, c);
  // The residual's values are loaded now, so that their round trip overlaps the dot products.
  float residual[R] = {};
  if constexpr (E == GemvOut::kPlain)
    if (a.residual != nullptr && threadIdx.x % 32 == 0)
#pragma unroll
      for (int r = 0; r < R; ++r) residual[r] = to_float(a.residual[r * a.out + o]);
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
  if constexpr (E == GemvOut::kRope) {
    gemv_rope_out<T, R>(a, o, acc);
  } else {
    if (threadIdx.x % 32 != 0) return;
    const auto biased = [&](int m, int r) {
      return acc[m][r] + (a.bias != nullptr ? to_float(a.bias[o + m * a.inter]) : 0.0f);
    };
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if constexpr (E == GemvOut::kSiluMul) {
        const float gate = to_float(from_float<T>(biased(0, r)));
        const float up = to_float(from_float<T>(biased(1, r)));
        a.act[r * a.inter + o] = from_float<T>(silu_mul_value(gate, up));
      } else {
        a.y[r * a.out + o] = from_float<T>(biased(0, r) + residual[r]);
      }
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

// RoPE goes into the GEMV when it needs no q/k norm (a reduction over the
// head) and a block's four pairs lie in one head.
bool rope_fits_gemv(const LinearParams& p) {
  const QkNormRopeParams& r = *p.qk_norm_rope;
  return r.q_norm_weight == nullptr && r.head_dim % 8 == 0;
}

template <typename T>
GemvRope<T> gemv_rope(const QkNormRopeParams& r) {
  GemvRope<T> g{.positions = r.positions,
                .inv_freq = r.inv_freq,
                .cos_sin_scale = r.cos_sin_scale,
                .slots = nullptr,
                .k_cache = nullptr,
                .v_cache = nullptr,
                .slot_stride = 0,
                .position_stride = 0,
                .head_stride = 0,
                .head_dim = static_cast<int>(r.head_dim),
                .num_heads = static_cast<int>(r.num_heads),
                .num_kv_heads = static_cast<int>(r.num_kv_heads)};
  if (r.kv_append) {
    const KvAppendParams& k = *r.kv_append;
    g.slots = k.slots, g.k_cache = static_cast<T*>(k.k_cache), g.v_cache = static_cast<T*>(k.v_cache);
    g.slot_stride = k.cache.slot_stride(), g.position_stride = k.cache.position_stride();
    g.head_stride = k.cache.head_stride();
  }
  return g;
}

// after_norm: x comes from a norm kernel queued just before (see gemv_kernel).
template <typename T>
void launch_gemv(const LinearParams& p, bool after_norm, cudaStream_t stream) {
  const SiluMulParams* s = p.silu_mul ? &*p.silu_mul : nullptr;
  const bool rope = p.qk_norm_rope.has_value();
  const GemvArgs<T> args{.x = static_cast<const T*>(p.x),
                         .x_stride = p.x_row_stride(),
                         .w = static_cast<const T*>(p.weight),
                         .bias = static_cast<const T*>(p.bias),
                         .y = static_cast<T*>(p.y),
                         .in = p.in_features,
                         .out = p.out_features,
                         .act = s ? static_cast<T*>(s->out) : nullptr,
                         .inter = s ? s->inter : 0,
                         .rope = rope ? gemv_rope<T>(*p.qk_norm_rope) : GemvRope<T>{},
                         .load_before_wait = !after_norm,
                         .residual = static_cast<const T*>(p.residual)};
  const dim3 grid(static_cast<unsigned>(ceil_div(s ? s->inter : p.out_features, kGemvWarps)));
  const auto go = [&](auto rows, auto out) {
    LS_LAUNCH("gemv_kernel", (gemv_kernel<T, decltype(rows)::value, decltype(out)::value>), grid,
              dim3(kGemvWarps * 32), 0, stream, args);
  };
  const auto with_out = [&](auto rows) {
    if (s)
      go(rows, std::integral_constant<GemvOut, GemvOut::kSiluMul>{});
    else if (rope)
      go(rows, std::integral_constant<GemvOut, GemvOut::kRope>{});
    else
      go(rows, std::integral_constant<GemvOut, GemvOut::kPlain>{});
  };
  if (p.rows == 1)
    with_out(std::integral_constant<int, 1>{});
  else
    with_out(std::integral_constant<int, 2>{});
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
  LS_CHECK_CUDA(cudaMalloc(&normed_, kNormedBytes));
}

LinearContext::~LinearContext() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.d);
    cublasLtMatmulDescDestroy(plan.op);
  }
  cudaFree(workspace_);
  cudaFree(normed_);
  cublasLtDestroy(handle_);
}

LinearContext::Key LinearContext::key(const LinearParams& p) {
  // C (the residual, when there is one) is read with D's layout and alignment.
  const int d_alignment = std::min(alignment(p.y), alignment(p.residual));
  return Key{p.rows, p.in_features, p.out_features, p.x_row_stride(), static_cast<int>(p.act_dtype),
             p.bias != nullptr, alignment(p.x), alignment(p.weight), d_alignment};
}

size_t LinearContext::normed_bytes() const { return kNormedBytes; }

std::vector<cublasLtMatmulAlgo_t> LinearContext::heuristic(const Plan& plan, const Key& key, int max) {
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
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(max));
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan.op, plan.a, plan.b, plan.d, plan.d,
                                                               pref, max, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  LS_REQUIRE(status == CUBLAS_STATUS_SUCCESS && found > 0, ErrorKind::kCublas,
             "cuBLASLt has no algorithm for linear rows={} in={} out={} dtype={} ({})", std::get<0>(key),
             std::get<1>(key), std::get<2>(key), dtype_name(static_cast<DType>(std::get<4>(key))),
             cublasGetStatusString(status));
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) algos.push_back(results[static_cast<size_t>(i)].algo);
  return algos;
}

const LinearContext::Plan& LinearContext::plan(const LinearParams& p) {
  const Key k = key(p);
  auto found = plans_.find(k);
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
  plan.algo = heuristic(plan, k, 1).front();
  return plans_.emplace(k, plan).first->second;
}

std::vector<cublasLtMatmulAlgo_t> LinearContext::algorithms(const LinearParams& p, int max) {
  return heuristic(plan(p), key(p), max);
}

void LinearContext::set_algorithm(const LinearParams& p, const cublasLtMatmulAlgo_t& algo) {
  plan(p);
  plans_.at(key(p)).algo = algo;
}

void linear(const LinearParams& p, LinearContext& ctx, cudaStream_t stream) {
  p.validate();
  LS_OP_REQUIRE(p.act_dtype == p.weight_dtype, "linear", "activations ({}) and weights ({}) must share a dtype",
                dtype_name(p.act_dtype), dtype_name(p.weight_dtype));
  if (p.rows == 0) return;
  if (p.input_rms && p.input_rms->normed != nullptr && p.rows >= kNormFirstRows) {
    rms_norm(RmsNormParams{.x = p.x, .out = p.input_rms->normed, .rows = p.rows, .cols = p.in_features,
                           .eps = p.input_rms->eps, .dtype = p.act_dtype},
             stream);
    LinearParams normed = p;
    normed.x = p.input_rms->normed, normed.input_rms.reset();
    linear(normed, ctx, stream);
    return;
  }
  if (p.input_norm) rms_norm(*p.input_norm, stream);
  const int64_t x_bytes = p.rows * p.in_features * static_cast<int64_t>(dtype_size(p.act_dtype));
  if (gemv_fits(p) && (!p.input_rms || x_bytes <= static_cast<int64_t>(ctx.normed_bytes()))) {
    LinearParams g = p;
    bool after_norm = p.input_norm.has_value();
    if (p.input_rms) {
      // 1-2 rows: the rows' scale by a norm kernel with no weight (the weight is in W), into scratch.
      // Scaling inside the GEMV (every warp summing squares of the x it reads) ran 1.7-2.2% slower at
      // batch 1 (benchmarks/NOTES.md, twenty-ninth session).
      rms_norm(RmsNormParams{.x = p.x, .out = ctx.normed(), .rows = p.rows, .cols = p.in_features,
                             .eps = p.input_rms->eps, .dtype = p.act_dtype},
               stream);
      g.x = ctx.normed(), g.input_rms.reset(), after_norm = true;
    }
    if (p.qk_norm_rope && !rope_fits_gemv(p)) g.qk_norm_rope.reset();
    dispatch_dtype(p.act_dtype, "linear", [&](auto t) { launch_gemv<decltype(t)>(g, after_norm, stream); });
    if (p.qk_norm_rope && !g.qk_norm_rope) qk_norm_rope(*p.qk_norm_rope, stream);
    return;
  }
  // With input_rms, cuBLASLt writes x·Wᵀ alone and the output stage scales each row and adds the bias.
  LinearParams product = p;
  if (p.input_rms) product.bias = nullptr;
  const LinearContext::Plan& plan = ctx.plan(product);
  if (product.bias != nullptr)
    LS_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &product.bias,
                                                   sizeof(product.bias)));
  const float alpha = 1.0f;
  const float beta = p.residual != nullptr ? 1.0f : 0.0f;
  const void* c = p.residual != nullptr ? p.residual : p.y;
  LS_CHECK_CUBLAS(cublasLtMatmul(ctx.handle(), plan.op, &alpha, p.weight, plan.a, p.x, plan.b, &beta, c, plan.d,
                                 p.y, plan.d, &plan.algo, ctx.workspace(), ctx.workspace_bytes(), stream));
  const RowScale scale{.x = p.x, .cols = p.in_features, .eps = p.input_rms ? p.input_rms->eps : 0.0f,
                       .bias = p.bias};
  const RowScale* scaled = p.input_rms ? &scale : nullptr;
  if (p.silu_mul) silu_mul(*p.silu_mul, scaled, stream);
  if (p.qk_norm_rope) qk_norm_rope(*p.qk_norm_rope, scaled, stream);
}

}  // namespace lockstep::cuda
