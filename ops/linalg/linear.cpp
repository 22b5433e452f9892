#include "linalg/linear.h"

#include <algorithm>
#include <bit>
#include <cstddef>
#include <vector>

#include <omp.h>

#include "core/convert.h"
#include "core/cpu_isa.h"
#include "core/error.h"
#include "cuda_kernels.h"
#include "linalg/gemm.h"
#include "linalg/gemm16.h"

namespace engine::ops {

namespace {

// The operands' type: all f32, or all one 16-bit type (the precision pass makes them so).
DType operand_type(const Node& node, const KernelContext& ctx, size_t count) {
  const DType type = ctx.dtype(node.inputs[0]);
  for (size_t i = 1; i < count && i < node.inputs.size(); ++i)
    ENGINE_CHECK(ctx.dtype(node.inputs[i]) == type, "linear " + node.name + ": operands of mixed types");
  return type;
}

void linear_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[0]);
  const Shape& ws = ctx.shape(node.inputs[1]);
  int64_t rows = xs.rows(), k = xs.last(), m = ws[0];
  if (DType type = operand_type(node, ctx, 3); type != DType::f32) {
    const void* bias = node.inputs.size() > 2 ? ctx.data(node.inputs[2]) : nullptr;
    gemm16({false, true, rows, m, k, k, k, m, type, ctx.dtype(node.outputs[0]), false}, ctx.data(node.inputs[0]),
           ctx.data(node.inputs[1]), bias, ctx.data(node.outputs[0]));
    return;
  }
  float* y = ctx.f32(node.outputs[0]);
  float beta = 0.0f;
  if (node.inputs.size() > 2) {
    const float* b = ctx.f32(node.inputs[2]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < m; ++j) y[r * m + j] = b[j];
    beta = 1.0f;
  }
  sgemm('N', 'T', rows, m, k, 1.0f, ctx.f32(node.inputs[0]), k, ctx.f32(node.inputs[1]), k, beta, y, m);
}

// inputs: dy (rows, M), W (M, K); output dx (rows, K)
void linear_backward_input_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& dys = ctx.shape(node.inputs[0]);
  const Shape& ws = ctx.shape(node.inputs[1]);
  int64_t rows = dys.rows(), m = ws[0], k = ws[1];
  if (DType type = operand_type(node, ctx, 2); type != DType::f32) {
    gemm16({false, false, rows, k, m, m, k, k, type, ctx.dtype(node.outputs[0]), ctx.accumulates(node, 0)},
           ctx.data(node.inputs[0]), ctx.data(node.inputs[1]), nullptr, ctx.data(node.outputs[0]));
    return;
  }
  sgemm('N', 'N', rows, k, m, 1.0f, ctx.f32(node.inputs[0]), m, ctx.f32(node.inputs[1]), k,
        ctx.accumulates(node, 0) ? 1.0f : 0.0f, ctx.f32(node.outputs[0]), k);
}

// db[j] += sum over rows of dy[r, j]. Each thread owns one contiguous range of columns and adds
// row after row of it into double accumulators (contiguous, vectorised), so each column is summed
// in row order whatever the thread count (the same double sum, bit for bit, as a column walked down
// the rows). A range as wide as the thread's share reads kilobytes of each row at once: stripes of
// 64 columns (256 bytes of each 6 KB row of an fc layer) ran at a third of the memory's bandwidth,
// each row a new page to the prefetcher. A range wider than kSumColumns (a vocabulary-wide bias)
// is summed kSumColumns at a time, so that its sums stay in L1.
constexpr int64_t kRangeAlign = 16;    // columns: whole cache lines of fp32 per range
constexpr int64_t kSumColumns = 2048;  // a range's columns summed at once: 16 KB of doubles, in L1

// sum[j] += load(r * m + j), j < width, rows in order.
template <class Load>
[[gnu::always_inline]] inline void column_sums(int64_t rows, int64_t m, int64_t width, double* sum, Load load) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t at = r * m;
#pragma omp simd
    for (int64_t j = 0; j < width; ++j) sum[j] += double(load(at + j));
  }
}

// Column sums of dy's columns [j0, j0 + width) into sum (zeroed by the caller).
[[gnu::always_inline]] inline void column_sums_of(const void* dy, DType type, int64_t rows, int64_t m, int64_t j0,
                                                  int64_t width, double* sum) {
  const auto* d16 = static_cast<const uint16_t*>(dy) + j0;
  const auto* d32 = static_cast<const float*>(dy) + j0;
  switch (type) {
    case DType::bf16:
      return column_sums(rows, m, width, sum, [=](int64_t i) { return std::bit_cast<float>(uint32_t(d16[i]) << 16); });
    case DType::f16:
      return column_sums(rows, m, width, sum, [=](int64_t i) { return f16_to_float(d16[i]); });
    default:
      return column_sums(rows, m, width, sum, [=](int64_t i) { return d32[i]; });
  }
}

// A range at each vector width (core/cpu_isa.h): the same double sums in the same order. The
// parallel region stays outside them (an OpenMP region's body is compiled once, at the build's width).
void column_sums_avx2(const void* dy, DType type, int64_t rows, int64_t m, int64_t j0, int64_t width, double* sum) {
  column_sums_of(dy, type, rows, m, j0, width, sum);
}
ENGINE_TARGET_AVX512 void column_sums_avx512(const void* dy, DType type, int64_t rows, int64_t m, int64_t j0,
                                             int64_t width, double* sum) {
  column_sums_of(dy, type, rows, m, j0, width, sum);
}

}  // namespace

void add_bias_gradient(const void* dy, DType type, int64_t rows, int64_t m, void* db, DType db_type) {
  auto* sums = kernel_isa() == CpuIsa::avx512 ? column_sums_avx512 : column_sums_avx2;
#pragma omp parallel if (rows * m > kSerialElements && m >= 2 * kRangeAlign)
  {
    const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
    const int64_t share = ((m + threads - 1) / threads + kRangeAlign - 1) / kRangeAlign * kRangeAlign;
    const int64_t j0 = std::min(m, thread * share), width = std::min(m, j0 + share) - j0;
    std::vector<double> sum(size_t(std::min(width, kSumColumns)));
    for (int64_t begin = j0; begin < j0 + width; begin += kSumColumns) {
      const int64_t count = std::min(kSumColumns, j0 + width - begin);
      std::fill_n(sum.begin(), count, 0.0);
      sums(dy, type, rows, m, begin, count, sum.data());
      for (int64_t j = 0; j < count; ++j) add_float(db, db_type, begin + j, float(sum[size_t(j)]));
    }
  }
}

namespace {

// A weight much taller than wide (a language model's head: 50257 x 384) computes faster as blocks
// of its transpose, dW^T[:, block] = x^T dy[:, block] (K x kWeightColumnBlock, measured 1.3 to 1.8x faster
// than dy^T x on this shape with oneDNN, fp32 and bf16), each added back transposed while in cache.
constexpr int64_t kWeightColumnBlock = 2048;

bool tall_weight(int64_t m, int64_t k) { return m >= 8 * k && m >= 2 * kWeightColumnBlock; }

void add_transposed(const float* t, int64_t k, int64_t width, float* dw) {
#pragma omp parallel for schedule(static)
  for (int64_t j0 = 0; j0 < width; j0 += 32)
    for (int64_t i0 = 0; i0 < k; i0 += 32)
      for (int64_t j = j0; j < std::min(width, j0 + 32); ++j)
        for (int64_t i = i0; i < std::min(k, i0 + 32); ++i) dw[j * k + i] += t[i * width + j];
}

}  // namespace

void linear_weight_gradient(const void* dy, const void* x, DType type, int64_t rows, int64_t m, int64_t k, float* dw) {
  const size_t size = dtype_size(type);
  if (!tall_weight(m, k)) {
    if (type == DType::f32)
      sgemm('T', 'N', m, k, rows, 1.0f, static_cast<const float*>(dy), m, static_cast<const float*>(x), k, 1.0f, dw, k);
    else
      gemm16({true, false, m, k, rows, m, k, k, type, DType::f32, true}, dy, x, nullptr, dw);
    return;
  }
  static thread_local std::vector<float> block;
  block.resize(size_t(k * kWeightColumnBlock));
  for (int64_t j0 = 0; j0 < m; j0 += kWeightColumnBlock) {
    const int64_t width = std::min(kWeightColumnBlock, m - j0);
    const void* dy_block = static_cast<const std::byte*>(dy) + size_t(j0) * size;
    if (type == DType::f32)
      sgemm('T', 'N', k, width, rows, 1.0f, static_cast<const float*>(x), k, static_cast<const float*>(dy_block), m,
            0.0f, block.data(), width);
    else
      gemm16({true, false, k, width, rows, k, m, width, type, DType::f32, false}, x, dy_block, nullptr, block.data());
    add_transposed(block.data(), k, width, dw + j0 * k);
  }
}

namespace {

// inputs: dy (rows, M), x (rows, K); outputs dW (M, K) [, db (M)], accumulated
void linear_backward_weight_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& dys = ctx.shape(node.inputs[0]);
  const Shape& xs = ctx.shape(node.inputs[1]);
  int64_t rows = dys.rows(), m = dys.last(), k = xs.last();
  const DType type = operand_type(node, ctx, 2);
  if (ctx.dtype(node.outputs[0]) == DType::f32) {
    linear_weight_gradient(ctx.data(node.inputs[0]), ctx.data(node.inputs[1]), type, rows, m, k,
                           ctx.f32(node.outputs[0]));
  } else {
    gemm16({true, false, m, k, rows, m, k, k, type, ctx.dtype(node.outputs[0]), true}, ctx.data(node.inputs[0]),
           ctx.data(node.inputs[1]), nullptr, ctx.data(node.outputs[0]));
  }
  if (node.outputs.size() > 1)
    add_bias_gradient(ctx.data(node.inputs[0]), type, rows, m, ctx.data(node.outputs[1]), ctx.dtype(node.outputs[1]));
}

void linear_grad(GradBuilder& gb, const Node& node) {
  Graph& g = gb.graph();
  ValueId x = node.inputs[0], w = node.inputs[1];
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  if (gb.wants(x)) {
    auto t = gb.target(x);
    gb.emit(kLinearBackwardInput, {dy, w}, {t.value}, t, {}, node.name);
  }
  // A frozen weight (LoRA's base) has no gradient: its product is never computed.
  const bool bias = node.inputs.size() > 2;
  if (!gb.wants(w)) {
    ENGINE_CHECK(!bias || !gb.wants(node.inputs[2]), node.name + ": a frozen weight with a trained bias");
    return;
  }
  std::vector<ValueId> outs{gb.target(w).value};
  if (bias) outs.push_back(gb.target(node.inputs[2]).value);
  g.add_node(Node{&kLinearBackwardWeight, {dy, x}, outs, {}, true, true, node.name});
}

double linear_flops(const Graph& g, const Node& n) {
  const Shape& xs = g.value(n.inputs[0]).shape;
  return 2.0 * double(xs.rows()) * double(xs.last()) * double(g.value(n.inputs[1]).shape[0]);
}

constexpr const char* kMatmul16 = "16-bit matmul (oneDNN), fp32 accumulation";

}  // namespace

constexpr const char* kCublas16 = "16-bit cuBLASLt matmul, fp32 accumulation";
const OpDef kLinear{.name = "linear",
                    .cpu = linear_cpu,
                    .cuda = cuda::linear,
                    .grad = linear_grad,
                    .flops = linear_flops,
                    .native_16bit = kMatmul16,
                    .native_for = matmul_16bit_available,
                    .cuda_16bit = kCublas16,
                    .matmul = true};
const OpDef kLinearBackwardInput{.name = "linear_backward_input",
                                 .cpu = linear_backward_input_cpu,
                                 .cuda = cuda::linear_backward_input,
                                 .flops =
                                     [](const Graph& g, const Node& n) {
                                       const Shape& dys = g.value(n.inputs[0]).shape;
                                       const Shape& ws = g.value(n.inputs[1]).shape;
                                       return 2.0 * double(dys.rows()) * double(ws[0]) * double(ws[1]);
                                     },
                                 .native_16bit = kMatmul16,
                                 .native_for = matmul_16bit_available,
                                 .cuda_16bit = kCublas16};
const OpDef kLinearBackwardWeight{.name = "linear_backward_weight",
                                  .cpu = linear_backward_weight_cpu,
                                  .cuda = cuda::linear_backward_weight,
                                  .flops =
                                      [](const Graph& g, const Node& n) {
                                        const Shape& dys = g.value(n.inputs[0]).shape;
                                        return 2.0 * double(dys.rows()) * double(dys.last()) *
                                               double(g.value(n.inputs[1]).shape.last());
                                      },
                                  .native_16bit = kMatmul16,
                                  .native_for = matmul_16bit_available,
                                  .cuda_16bit = kCublas16};

ValueId linear(Graph& g, ValueId x, ValueId w, ValueId b, const std::string& name) {
  const Shape& xs = g.value(x).shape;
  const Shape& ws = g.value(w).shape;
  if (ws.rank() != 2) shape_error(name, "weight must be 2-D, got " + ws.str());
  if (xs.last() != ws[1]) shape_error(name, "input " + xs.str() + " does not match weight " + ws.str());
  if (b != kNoValue && g.value(b).shape != Shape{ws[0]})
    shape_error(name, "bias " + g.value(b).shape.str() + " does not match weight " + ws.str());
  std::vector<int64_t> dims = xs.dims;
  dims.back() = ws[0];
  ValueId y = g.add_activation(name + ".out", Shape(dims));
  std::vector<ValueId> inputs{x, w};
  if (b != kNoValue) inputs.push_back(b);
  g.add_node(Node{&kLinear, inputs, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
