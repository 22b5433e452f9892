// CUDA kernels of linear (ops/linalg/linear.h) and matmul (ops/linalg/matmul.h): every product
// through cuBLASLt, fp32 with pure fp32 compute (CUBLAS_COMPUTE_32F: no TF32, so fp32 runs track
// the CPU), bf16 and fp16 with fp32 accumulation. The forward adds the bias in cuBLASLt's epilogue.
// The bias gradient is summed by the weight gradient's product as it reads dy (cuBLASLt's BGRADB
// epilogue: float column sums, in the algorithm's fixed order, so the same bits on every run of a
// card and library) and added to db; where cuBLASLt offers no algorithm with that epilogue (fp32's
// pure fp32 compute, say), a column sum of dy of its own in a fixed row order, in double, as the
// CPU sums it. linear_gelu and linear_backward_input_gelu (ops/linalg/linear_gelu.h) carry GELU in
// the epilogue (GELU_AUX_BIAS forward, DGELU backward), composing the unfused kernels where
// cuBLASLt has no algorithm for that epilogue.
//
// Row-major operands are column-major transposes, so each row-major product C = A B is issued as
// C^T = B^T A^T with the operands swapped (m and n swap with them).
#include <cublasLt.h>

#include <atomic>
#include <map>
#include <optional>
#include <tuple>

#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "linalg/linear_gelu.h"

namespace engine::cuda {
namespace {

void check_blas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw InternalError(std::string("cuBLASLt ") + what + ": status " + std::to_string(int(status)));
}

cudaDataType_t blas_type(DType type) {
  switch (type) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      throw InternalError("cuBLASLt product of a non-float value");
  }
}

enum class GeluEpilogue { none, gelu_aux, dgelu };

// One column-major product D = alpha op(A) op(B) + beta C (C is D), batched by strides.
struct Product {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  DType a_type = DType::f32;
  int64_t lda = 0;
  const void* b = nullptr;
  DType b_type = DType::f32;
  int64_t ldb = 0;
  void* c = nullptr;
  DType c_type = DType::f32;
  int64_t ldc = 0;
  float beta = 0;
  const void* bias = nullptr;      // (m) added to every column: the BIAS epilogue
  float* bias_gradient = nullptr;  // (n) op(B)'s sums over k, written: the BGRADB epilogue
  // GELU in the epilogue, with an auxiliary matrix of D's shape and type (leading dimension m):
  //   gelu_aux  D = gelu(product + bias), aux = product + bias (GELU_AUX_BIAS)
  //   dgelu     D = gelu'(aux) * product (DGELU)
  GeluEpilogue gelu = GeluEpilogue::none;
  void* aux = nullptr;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
  size_t workspace_bytes = 0;  // of the context's workspace cuBLASLt may use (0: all of it)
};

// The product's shape, types and epilogue, with the alignments of A, B and C/D and the workspace
// the algorithm may use: everything the heuristic's choice depends on.
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t, bool, bool,
                           int64_t, bool, int, uint32_t, uint32_t, uint32_t, uint64_t>;

// The alignment cuBLASLt may assume of a matrix at `data` (every batch's, `stride_bytes` apart):
// the lowest set bit of the address, up to the 256 bytes its heuristic assumes unless told less.
// Every device block and arena value starts 256-aligned (kArenaAlignment); a parameter inside a
// unit's flat buffer, or a view, may start anywhere, alike in every layout.
uint32_t matrix_alignment(const void* data, int64_t batch, int64_t stride_bytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(data) | 256u;
  if (batch > 1) bits |= uint64_t(stride_bytes);
  return uint32_t(bits & (~bits + 1));
}

// Choices measured once per card and library: for a product where bench/cublaslt_candidates found
// a candidate the heuristic offers clearly faster than its first (1.15x or more), that candidate's
// place in the heuristic's list. A fixed table rather than a timing at run time, so that a run's
// algorithms, and so its bits, do not follow the timing noise. For bf16 operands with f32 compute,
// no bias, beta 0, unbatched; (card, cuBLASLt major version, transposes, m, n, k, candidate, GELU
// epilogue).
struct MeasuredChoice {
  const char* card;
  int blas_major;
  bool transpose_a, transpose_b;
  int64_t m, n, k;
  int candidate;
  GeluEpilogue gelu = GeluEpilogue::none;
};
constexpr MeasuredChoice kMeasuredChoices[] = {
    // GPT-2 124M at 32 x 1024 tokens (H100 80GB, cuBLASLt 13.0, 2026-11-26):
    {"NVIDIA H100 80GB HBM3", 13, true, false, 50304, 32768, 768, 6},   // head forward: 3.90 -> 3.55 ms
    {"NVIDIA H100 80GB HBM3", 13, false, false, 768, 32768, 50304, 5},  // head input gradient: 4.08 -> 3.49 ms
    {"NVIDIA H100 80GB HBM3", 13, false, false, 3072, 32768, 768, 6},   // fc_proj input gradient: 0.26 -> 0.21 ms
    // 2026-11-27: the attention projection's input gradient, 0.118 -> 0.091 ms; the fc projection's
    // with GELU's backward in the epilogue (DGELU), 0.354-0.360 -> 0.303 ms
    {"NVIDIA H100 80GB HBM3", 13, false, false, 768, 32768, 768, 7},
    {"NVIDIA H100 80GB HBM3", 13, false, false, 3072, 32768, 768, 3, GeluEpilogue::dgelu},
};

// The table's candidate for product `p` on the current device, or 0 (the heuristic's first).
int measured_candidate(const Product& p) {
  if (p.a_type != DType::bf16 || p.bias || p.bias_gradient || p.beta != 0 || p.batch != 1) return 0;
  static const std::string card = [] {
    int device = 0;
    cudaDeviceProp prop{};
    return cudaGetDevice(&device) == cudaSuccess && cudaGetDeviceProperties(&prop, device) == cudaSuccess
               ? std::string(prop.name)
               : std::string();
  }();
  static const int blas_major = int(cublasLtGetVersion() / 10000);
  for (const MeasuredChoice& c : kMeasuredChoices)
    if (card == c.card && blas_major == c.blas_major && p.transpose_a == c.transpose_a &&
        p.transpose_b == c.transpose_b && p.m == c.m && p.n == c.n && p.k == c.k && p.gelu == c.gelu)
      return c.candidate;
  return 0;
}

// The heuristic's first algorithm per shape (or the table's), asked once: a step repeats the same few products
// (none: the heuristic offered nothing for that epilogue).
std::map<PlanKey, std::optional<cublasLtMatmulAlgo_t>>& algorithm_cache() {
  static std::map<PlanKey, std::optional<cublasLtMatmulAlgo_t>> cache;
  return cache;
}

struct Layouts {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Layouts() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

cublasLtMatrixLayout_t layout(DType type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t out = nullptr;
  check_blas(cublasLtMatrixLayoutCreate(&out, blas_type(type), uint64_t(rows), uint64_t(cols), ld), "layout");
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    check_blas(cublasLtMatrixLayoutSetAttribute(out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "batch count");
    check_blas(
        cublasLtMatrixLayoutSetAttribute(out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
        "batch stride");
  }
  return out;
}

// Runs the product; false, having run nothing, where it asks for the bias gradient's or a GELU
// epilogue and cuBLASLt has no algorithm for it.
bool run_product(const KernelContext& ctx, const Product& p) {
  if (p.a_type != p.b_type) throw InternalError("cuBLASLt product of operands of different types");
  auto handle = static_cast<cublasLtHandle_t>(ctx.blas);
  Layouts l;
  check_blas(cublasLtMatmulDescCreate(&l.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
  const cublasOperation_t ta = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                          tb = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  // The epilogue: BIAS, BGRADB, GELU_AUX(_BIAS) or DGELU, with their vectors and aux matrix.
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* vector = nullptr;
  cudaDataType_t vector_type = blas_type(p.c_type);
  switch (p.gelu) {
    case GeluEpilogue::none:
      if (p.bias) epilogue = CUBLASLT_EPILOGUE_BIAS, vector = p.bias;
      if (p.bias_gradient) epilogue = CUBLASLT_EPILOGUE_BGRADB, vector = p.bias_gradient, vector_type = CUDA_R_32F;
      break;
    case GeluEpilogue::gelu_aux:
      epilogue = p.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, vector = p.bias;
      break;
    case GeluEpilogue::dgelu:
      if (p.bias_gradient) throw InternalError("cuBLASLt product: DGELU with a bias gradient");
      epilogue = CUBLASLT_EPILOGUE_DGELU;
      break;
  }
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
    check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)),
               "epilogue");
  if (vector) {
    check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vector, sizeof(vector)),
               "bias");
    check_blas(
        cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &vector_type, sizeof(vector_type)),
        "bias type");
  }
  if (p.gelu != GeluEpilogue::none) {
    const int64_t aux_ld = p.m;  // the aux matrix's type is D's (the attribute left unset)
    check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)),
               "aux");
    check_blas(cublasLtMatmulDescSetAttribute(l.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)),
               "aux leading dimension");
  }
  l.a = layout(p.a_type, p.transpose_a ? p.k : p.m, p.transpose_a ? p.m : p.k, p.lda, p.batch, p.stride_a);
  l.b = layout(p.b_type, p.transpose_b ? p.n : p.k, p.transpose_b ? p.k : p.n, p.ldb, p.batch, p.stride_b);
  l.c = layout(p.c_type, p.m, p.n, p.ldc, p.batch, p.stride_c);
  const PlanKey key{p.transpose_a,
                    p.transpose_b,
                    p.m,
                    p.n,
                    p.k,
                    int(p.a_type),
                    int(p.c_type),
                    int(p.batch > 1),
                    p.lda,
                    p.ldb,
                    p.ldc,
                    p.bias != nullptr,
                    p.beta != 0,
                    p.batch,
                    p.bias_gradient != nullptr,
                    int(p.gelu),
                    matrix_alignment(p.a, p.batch, p.stride_a * int64_t(dtype_size(p.a_type))),
                    matrix_alignment(p.b, p.batch, p.stride_b * int64_t(dtype_size(p.b_type))),
                    matrix_alignment(p.c, p.batch, p.stride_c * int64_t(dtype_size(p.c_type))),
                    uint64_t(p.workspace_bytes ? p.workspace_bytes : ctx.workspace_bytes)};
  auto& cache = algorithm_cache();
  auto found = cache.find(key);
  if (found == cache.end()) {
    cublasLtMatmulPreference_t preference = nullptr;
    check_blas(cublasLtMatmulPreferenceCreate(&preference), "preference");
    const uint64_t workspace = p.workspace_bytes ? p.workspace_bytes : ctx.workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof(workspace));
    // Only algorithms that work at the operands' real alignment (C and D are one matrix here).
    const uint32_t align_a = std::get<16>(key), align_b = std::get<17>(key), align_c = std::get<18>(key);
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                         sizeof(align_a));
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                         sizeof(align_b));
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof(align_c));
    cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof(align_c));
    constexpr int kOffers = 8;
    const int candidate = measured_candidate(p);
    cublasLtMatmulHeuristicResult_t results[kOffers]{};
    int count = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle, l.op, l.a, l.b, l.c, l.c, preference,
                                                                 candidate > 0 ? kOffers : 1, results, &count);
    const cublasLtMatmulHeuristicResult_t& result = results[candidate < count ? candidate : 0];
    cublasLtMatmulPreferenceDestroy(preference);
    const bool composable = p.bias_gradient || p.gelu != GeluEpilogue::none;  // the caller composes without it
    if (composable && (status != CUBLAS_STATUS_SUCCESS || count == 0)) {
      cache.emplace(key, std::nullopt);
      return false;
    }
    check_blas(status, "heuristic");
    if (count == 0) throw InternalError("cuBLASLt has no algorithm for a product of this shape");
    found = cache.emplace(key, result.algo).first;
  }
  if (!found->second) return false;
  const float alpha = 1.0f;
  const cublasStatus_t status =
      cublasLtMatmul(handle, l.op, &alpha, p.a, l.a, p.b, l.b, &p.beta, p.c, l.c, p.c, l.c, &*found->second,
                     ctx.workspace, p.workspace_bytes ? p.workspace_bytes : ctx.workspace_bytes, stream(ctx));
  if ((status == CUBLAS_STATUS_INVALID_VALUE || status == CUBLAS_STATUS_NOT_SUPPORTED) &&
      (p.bias_gradient || p.gelu != GeluEpilogue::none)) {
    // An epilogue the heuristic offered but the call refuses for these types: compose, from now on.
    cache.erase(found);
    cache.emplace(key, std::nullopt);
    return false;
  }
  check_blas(status, "matmul");
  return true;
}

// db[j] (+)= sum over rows of dy[r, j], in a fixed order whatever the device: rows in chunks of
// kBiasChunkRows, each chunk's column sums in double in row order; kBiasChunksPerSpan chunks' sums
// added in chunk order into one span's; the spans' sums added in span order and added to db once in
// float (as core/convert.h add_float). The CPU sums all rows in one double; the two orders differ
// in the double's last bits only, so the float results agree but at a rounding boundary.
//
// One thread per (pack of columns, chunk): a pack is 16 bytes of dy (8 16-bit or 4 f32 columns)
// read in one access where every row of dy starts 16-byte aligned, else one column. A block is 32
// packs x kBiasChunksPerSpan chunks, reads coalesced across the packs of a row.
constexpr int64_t kBiasChunkRows = 64;
constexpr int kBiasChunksPerSpan = 8;
constexpr int kBiasRowsInFlight = 4;

template <class T, int P>  // P: the columns of a pack (kPack<T>, or 1)
__global__ void __launch_bounds__(32 * kBiasChunksPerSpan)
    bias_span_sums(const T* dy, int64_t rows, int64_t cols, int64_t chunk_rows, double* partials) {  // (spans, cols)
  __shared__ double chunk_sums[kBiasChunksPerSpan][32][P];
  const int pack = int(threadIdx.x) & 31, chunk = int(threadIdx.x) >> 5;
  const int64_t j = (int64_t(blockIdx.x) * 32 + pack) * P, span = blockIdx.y;
  const int64_t first = (span * kBiasChunksPerSpan + chunk) * chunk_rows;
  const int64_t last = first + chunk_rows < rows ? first + chunk_rows : rows;
  double sum[P] = {};
  const auto load = [&](int64_t r, float(&v)[P]) {
    if constexpr (P > 1) {
      load_pack(dy, r * cols + j, v);
    } else {
      v[0] = to_float(dy[r * cols + j]);
    }
  };
  if (j < cols) {
    // kBiasRowsInFlight rows' loads issued before their sums, so that many reads are in flight per
    // thread (one at a time ran at a quarter of the memory's bandwidth); the sums stay in row order.
    int64_t r = first;
    for (; r + kBiasRowsInFlight <= last; r += kBiasRowsInFlight) {
      float v[kBiasRowsInFlight][P];
#pragma unroll
      for (int u = 0; u < kBiasRowsInFlight; ++u) load(r + u, v[u]);
#pragma unroll
      for (int u = 0; u < kBiasRowsInFlight; ++u)
#pragma unroll
        for (int e = 0; e < P; ++e) sum[e] += double(v[u][e]);
    }
    for (; r < last; ++r) {
      float v[P];
      load(r, v);
#pragma unroll
      for (int e = 0; e < P; ++e) sum[e] += double(v[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < P; ++e) chunk_sums[chunk][pack][e] = sum[e];
  __syncthreads();
  if (chunk != 0 || j >= cols) return;
  for (int e = 0; e < P; ++e) {
    double total = 0;
    for (int k = 0; k < kBiasChunksPerSpan; ++k) total += chunk_sums[k][pack][e];
    partials[span * cols + j + e] = total;
  }
}

__global__ void bias_add_spans(const double* partials, int64_t spans, int64_t cols, void* db, DType db_type) {
  for (int64_t j = thread_index(); j < cols; j += thread_stride()) {
    double sum = 0;
    for (int64_t s = 0; s < spans; ++s) sum += partials[s * cols + j];
    store_float(db, db_type, j, load_float(db, db_type, j) + float(sum));
  }
}

template <class T>
void launch_bias_spans(const KernelContext& ctx, const void* dy, int64_t rows, int64_t cols, int64_t chunk_rows,
                       int64_t spans, double* partials) {
  constexpr int P = kPack<T>;
  const bool packed = cols % P == 0 && pack_aligned(dy);
  const int64_t packs = packed ? cols / P : cols;
  const dim3 grid(unsigned((packs + 31) / 32), unsigned(spans));
  if (packed)
    bias_span_sums<T, P><<<grid, 32 * kBiasChunksPerSpan, 0, stream(ctx)>>>(static_cast<const T*>(dy), rows, cols,
                                                                            chunk_rows, partials);
  else
    bias_span_sums<T, 1><<<grid, 32 * kBiasChunksPerSpan, 0, stream(ctx)>>>(static_cast<const T*>(dy), rows, cols,
                                                                            chunk_rows, partials);
  check_launch("bias_span_sums");
}

void bias_gradient(const KernelContext& ctx, const void* dy, DType dy_type, int64_t rows, int64_t cols, void* db,
                   DType db_type) {
  // As many spans as the workspace holds partial sums for, of at least kBiasChunkRows rows a chunk.
  const int64_t fit = int64_t(ctx.workspace_bytes / sizeof(double)) / cols;
  if (fit < 1) throw InternalError("linear_backward_weight: the workspace cannot hold one row of bias partial sums");
  int64_t chunk_rows = kBiasChunkRows;
  const auto spans_of = [&](int64_t chunk) {
    const int64_t span_rows = chunk * kBiasChunksPerSpan;
    return (rows + span_rows - 1) / span_rows;
  };
  if (spans_of(chunk_rows) > fit) chunk_rows = (rows + fit * kBiasChunksPerSpan - 1) / (fit * kBiasChunksPerSpan);
  const int64_t spans = rows == 0 ? 0 : spans_of(chunk_rows);
  if (spans > 65535) throw InternalError("linear_backward_weight: too many rows for the bias gradient's grid");
  auto* partials = static_cast<double*>(ctx.workspace);
  if (spans > 0) {
    switch (dy_type) {
      case DType::bf16:
        launch_bias_spans<__nv_bfloat16>(ctx, dy, rows, cols, chunk_rows, spans, partials);
        break;
      case DType::f16:
        launch_bias_spans<__half>(ctx, dy, rows, cols, chunk_rows, spans, partials);
        break;
      default:
        launch_bias_spans<float>(ctx, dy, rows, cols, chunk_rows, spans, partials);
    }
  }
  bias_add_spans<<<blocks_for(cols, 128), 128, 0, stream(ctx)>>>(partials, spans, cols, db, db_type);
  check_launch("bias_add_spans");
}

// db[j] (+)= sums[j], once in float (as core/convert.h add_float).
__global__ void add_column_sums(const float* sums, int64_t cols, void* db, DType db_type) {
  for (int64_t j = thread_index(); j < cols; j += thread_stride())
    store_float(db, db_type, j, load_float(db, db_type, j) + sums[j]);
}

}  // namespace

namespace {

// y (rows, M) = x (rows, K) W^T + b: C^T (M, rows) = W (M, K) x^T, W stored (K, M) column-major.
Product forward_product(const Node& node, const KernelContext& ctx, ValueId y) {
  const ValueId x = node.inputs[0], w = node.inputs[1];
  const Shape& ws = ctx.shape(w);
  const int64_t m = ws[0], k = ws[1], rows = ctx.shape(x).numel() / k;
  Product p;
  p.transpose_a = true;
  p.m = m, p.n = rows, p.k = k;
  p.a = ctx.data(w), p.a_type = ctx.dtype(w), p.lda = k;
  p.b = ctx.data(x), p.b_type = ctx.dtype(x), p.ldb = k;
  p.c = ctx.data(y), p.c_type = ctx.dtype(y), p.ldc = m;
  p.beta = ctx.accumulates(node, 0) ? 1.0f : 0.0f;
  if (node.inputs.size() > 2) {
    if (ctx.dtype(node.inputs[2]) != p.c_type) throw InternalError("linear: bias and output types differ on CUDA");
    p.bias = ctx.data(node.inputs[2]);
  }
  return p;
}

// dx (rows, K) (+)= dy (rows, M) W (M, K): dx^T (K, rows) = W^T dy^T, both stored as they are.
Product input_gradient_product(const Node& node, const KernelContext& ctx) {
  const ValueId dy = node.inputs[0], w = node.inputs[1], dx = node.outputs[0];
  const Shape& ws = ctx.shape(w);
  const int64_t m = ws[0], k = ws[1], rows = ctx.shape(dy).numel() / m;
  Product p;
  p.m = k, p.n = rows, p.k = m;
  p.a = ctx.data(w), p.a_type = ctx.dtype(w), p.lda = k;
  p.b = ctx.data(dy), p.b_type = ctx.dtype(dy), p.ldb = m;
  p.c = ctx.data(dx), p.c_type = ctx.dtype(dx), p.ldc = k;
  p.beta = ctx.accumulates(node, 0) ? 1.0f : 0.0f;
  return p;
}

// Where a product's epilogue leaves `count` float sums: the workspace's last 256-aligned bytes
// (cuBLASLt has the rest; the workspace may be any size a kernel asked for), or nullptr where the
// workspace is too small to split.
float* split_sums(const KernelContext& ctx, Product& p, int64_t count) {
  const size_t sums_bytes = (size_t(count) * sizeof(float) + 255) / 256 * 256;
  if (ctx.workspace_bytes <= 2 * sums_bytes) return nullptr;
  p.workspace_bytes = (ctx.workspace_bytes - sums_bytes) / 256 * 256;
  return reinterpret_cast<float*>(static_cast<char*>(ctx.workspace) + p.workspace_bytes);
}

std::atomic<int64_t> fused_gelu_products{0}, composed_gelu_products{0};

}  // namespace

void linear(const Node& node, const KernelContext& ctx) {
  run_product(ctx, forward_product(node, ctx, node.outputs[0]));
}

void linear_backward_input(const Node& node, const KernelContext& ctx) {
  run_product(ctx, input_gradient_product(node, ctx));
}

// a = x W^T + b, f = gelu(a): one product with the GELU_AUX_BIAS epilogue (a is its aux matrix);
// where cuBLASLt has none for the shape or types, the product and the GELU kernel.
void linear_gelu(const Node& node, const KernelContext& ctx) {
  const ValueId a = node.outputs[0], f = node.outputs[1];
  Product p = forward_product(node, ctx, f);
  p.gelu = GeluEpilogue::gelu_aux;
  p.aux = ctx.data(a);
  if (p.beta == 0 && ctx.dtype(a) == ctx.dtype(f) && run_product(ctx, p)) {
    ++fused_gelu_products;
    return;
  }
  ++composed_gelu_products;
  linear(Node{node.op, node.inputs, {a}, {}, false, node.backward, node.name}, ctx);
  gelu(Node{node.op, {a}, {f}, {}, false, node.backward, node.name}, ctx);
}

// da = gelu'(a) * (dy W): one product with the DGELU epilogue; where cuBLASLt has none, the product
// and the GELU backward kernel over its result in place.
void linear_backward_input_gelu(const Node& node, const KernelContext& ctx) {
  const ValueId a = node.inputs[2], da = node.outputs[0];
  const Node product{node.op, {node.inputs[0], node.inputs[1]}, {da}, {}, false, true, node.name};
  Product p = input_gradient_product(product, ctx);
  p.gelu = GeluEpilogue::dgelu;
  p.aux = ctx.data(a);
  if (p.beta == 0 && ctx.dtype(a) == ctx.dtype(da) && run_product(ctx, p)) {
    ++fused_gelu_products;
    return;
  }
  ++composed_gelu_products;
  linear_backward_input(product, ctx);
  gelu_backward(Node{node.op, {a, da}, {da}, {}, false, true, node.name}, ctx);
}

GeluProducts gelu_products() { return {fused_gelu_products.load(), composed_gelu_products.load()}; }

// dW (M, K) += dy^T x: dW^T (K, M) = x^T (K, rows) dy (rows, M); db (M) += column sums of dy.
void linear_backward_weight(const Node& node, const KernelContext& ctx) {
  const ValueId dy = node.inputs[0], x = node.inputs[1], dw = node.outputs[0];
  const int64_t m = ctx.shape(dw)[0], k = ctx.shape(dw)[1], rows = ctx.shape(dy).numel() / m;
  Product p;
  p.transpose_b = true;
  p.m = k, p.n = m, p.k = rows;
  p.a = ctx.data(x), p.a_type = ctx.dtype(x), p.lda = k;
  p.b = ctx.data(dy), p.b_type = ctx.dtype(dy), p.ldb = m;
  p.c = ctx.data(dw), p.c_type = ctx.dtype(dw), p.ldc = k;
  p.beta = ctx.accumulates(node, 0) ? 1.0f : 0.0f;
  if (node.outputs.size() == 1) {
    run_product(ctx, p);
    return;
  }
  const ValueId db = node.outputs[1];
  if (!ctx.accumulates(node, 1)) throw InternalError("linear_backward_weight: the bias gradient always accumulates");
  // The product's epilogue sums dy's columns into the workspace's last bytes; then they are added to db.
  if ((p.bias_gradient = split_sums(ctx, p, m))) {
    if (run_product(ctx, p)) {
      add_column_sums<<<blocks_for(m, 128), 128, 0, stream(ctx)>>>(p.bias_gradient, m, ctx.data(db), ctx.dtype(db));
      check_launch("add_column_sums");
      return;
    }
    p.workspace_bytes = 0;
    p.bias_gradient = nullptr;
  }
  run_product(ctx, p);
  bias_gradient(ctx, ctx.data(dy), ctx.dtype(dy), rows, m, ctx.data(db), ctx.dtype(db));
}

// C[b] (M, N) = op(A[b]) op(B[b]) row-major: C^T (N, M) = op(B)^T op(A)^T, the stored operands swapped.
void matmul(const Node& node, const KernelContext& ctx) {
  const bool ta = node.attrs.ints[0] != 0, tb = node.attrs.ints[1] != 0;
  const Shape& as = ctx.shape(node.inputs[0]);
  const Shape& bs = ctx.shape(node.inputs[1]);
  const int64_t a_rows = as[as.rank() - 2], a_cols = as.last(), b_cols = bs.last();
  const int64_t m = ta ? a_cols : a_rows, k = ta ? a_rows : a_cols, n = tb ? bs[bs.rank() - 2] : b_cols;
  const int64_t batch = as.numel() / (a_rows * a_cols);
  Product p;
  p.transpose_a = tb, p.transpose_b = ta;
  p.m = n, p.n = m, p.k = k;
  p.a = ctx.data(node.inputs[1]), p.a_type = ctx.dtype(node.inputs[1]), p.lda = b_cols;
  p.b = ctx.data(node.inputs[0]), p.b_type = ctx.dtype(node.inputs[0]), p.ldb = a_cols;
  p.c = ctx.data(node.outputs[0]), p.c_type = ctx.dtype(node.outputs[0]), p.ldc = n;
  p.beta = ctx.accumulates(node, 0) ? 1.0f : 0.0f;
  p.batch = batch, p.stride_a = bs.numel() / batch, p.stride_b = as.numel() / batch, p.stride_c = m * n;
  run_product(ctx, p);
}

}  // namespace engine::cuda

namespace engine::cuda {
namespace {

__global__ void fill_pattern(void* data, DType type, int64_t n) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    store_float(data, type, i, float(int((i * 2654435761u) % 2001u) - 1000) * 1e-3f);  // never zeros
}

}  // namespace

double measure_matmul_flops(DType type, int64_t n) {
  const size_t bytes = size_t(n * n) * dtype_size(type);
  void *a = nullptr, *b = nullptr, *c = nullptr, *workspace = nullptr;
  constexpr size_t kWorkspace = size_t(32) << 20;
  check(cudaMalloc(&a, bytes), "probe allocation");
  check(cudaMalloc(&b, bytes), "probe allocation");
  check(cudaMalloc(&c, bytes), "probe allocation");
  check(cudaMalloc(&workspace, kWorkspace), "probe allocation");
  cudaStream_t s = nullptr;
  check(cudaStreamCreate(&s), "probe stream");
  cublasLtHandle_t handle = nullptr;
  check_blas(cublasLtCreate(&handle), "handle");
  fill_pattern<<<blocks_for(n * n), kThreads, 0, s>>>(a, type, n * n);
  fill_pattern<<<blocks_for(n * n), kThreads, 0, s>>>(b, type, n * n);
  KernelContext ctx;
  ctx.stream = s;
  ctx.blas = handle;
  ctx.workspace = workspace;
  ctx.workspace_bytes = kWorkspace;
  Product p;
  p.transpose_a = true;
  p.m = p.n = p.k = n;
  p.a = a, p.a_type = type, p.lda = n;
  p.b = b, p.b_type = type, p.ldb = n;
  p.c = c, p.c_type = type, p.ldc = n;
  for (int i = 0; i < 3; ++i) run_product(ctx, p);  // warm-up
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  constexpr int kRuns = 10;
  check(cudaEventRecord(start, s), "event");
  for (int i = 0; i < kRuns; ++i) run_product(ctx, p);
  check(cudaEventRecord(stop, s), "event");
  check(cudaEventSynchronize(stop), "probe");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "event time");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cublasLtDestroy(handle);
  cudaStreamDestroy(s);
  cudaFree(a), cudaFree(b), cudaFree(c), cudaFree(workspace);
  return 2.0 * double(n) * double(n) * double(n) * kRuns / (double(ms) * 1e-3);
}

double measure_copy_bandwidth(int64_t bytes) {
  void *from = nullptr, *to = nullptr;
  check(cudaMalloc(&from, size_t(bytes)), "probe allocation");
  check(cudaMalloc(&to, size_t(bytes)), "probe allocation");
  cudaStream_t s = nullptr;
  check(cudaStreamCreate(&s), "probe stream");
  check(cudaMemsetAsync(from, 1, size_t(bytes), s), "probe fill");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  float best = 0;
  for (int run = 0; run < 6; ++run) {  // the first a warm-up
    check(cudaEventRecord(start, s), "event");
    check(cudaMemcpyAsync(to, from, size_t(bytes), cudaMemcpyDeviceToDevice, s), "probe copy");
    check(cudaEventRecord(stop, s), "event");
    check(cudaEventSynchronize(stop), "probe");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "event time");
    if (run > 0 && (best == 0 || ms < best)) best = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(s);
  cudaFree(from), cudaFree(to);
  return 2.0 * double(bytes) / (double(best) * 1e-3);
}

}  // namespace engine::cuda
