#include "linalg/linear.h"

#include "core/convert.h"
#include "core/error.h"
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

// inputs: dy (rows, M), x (rows, K); outputs dW (M, K) [, db (M)], accumulated
void linear_backward_weight_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& dys = ctx.shape(node.inputs[0]);
  const Shape& xs = ctx.shape(node.inputs[1]);
  int64_t rows = dys.rows(), m = dys.last(), k = xs.last();
  if (DType type = operand_type(node, ctx, 2); type != DType::f32) {
    gemm16({true, false, m, k, rows, m, k, k, type, ctx.dtype(node.outputs[0]), true}, ctx.data(node.inputs[0]),
           ctx.data(node.inputs[1]), nullptr, ctx.data(node.outputs[0]));
    if (node.outputs.size() > 1) {
      const void* dy = ctx.data(node.inputs[0]);
      void* db = ctx.data(node.outputs[1]);
      const DType db_type = ctx.dtype(node.outputs[1]);
#pragma omp parallel for schedule(static)
      for (int64_t j = 0; j < m; ++j) {
        double sum = 0;
        for (int64_t r = 0; r < rows; ++r) sum += load_float(dy, type, r * m + j);
        add_float(db, db_type, j, float(sum));
      }
    }
    return;
  }
  const float* dy = ctx.f32(node.inputs[0]);
  sgemm('T', 'N', m, k, rows, 1.0f, dy, m, ctx.f32(node.inputs[1]), k, 1.0f, ctx.f32(node.outputs[0]), k);
  if (node.outputs.size() > 1) {
    float* db = ctx.f32(node.outputs[1]);
    // Column sums in a fixed order per column: deterministic whatever the thread count.
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < m; ++j) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += dy[r * m + j];
      db[j] += static_cast<float>(sum);
    }
  }
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
  std::vector<ValueId> outs{gb.target(w).value};
  if (node.inputs.size() > 2) outs.push_back(gb.target(node.inputs[2]).value);
  g.add_node(Node{&kLinearBackwardWeight, {dy, x}, outs, {}, true, true, node.name});
}

double linear_flops(const Graph& g, const Node& n) {
  const Shape& xs = g.value(n.inputs[0]).shape;
  return 2.0 * double(xs.rows()) * double(xs.last()) * double(g.value(n.inputs[1]).shape[0]);
}

constexpr const char* kMatmul16 = "16-bit matmul (oneDNN), fp32 accumulation";

}  // namespace

const OpDef kLinear{"linear", linear_cpu, linear_grad, linear_flops, kMatmul16, 0, matmul_16bit_available};
const OpDef kLinearBackwardInput{"linear_backward_input",
                                 linear_backward_input_cpu,
                                 nullptr,
                                 [](const Graph& g, const Node& n) {
                                   const Shape& dys = g.value(n.inputs[0]).shape;
                                   const Shape& ws = g.value(n.inputs[1]).shape;
                                   return 2.0 * double(dys.rows()) * double(ws[0]) * double(ws[1]);
                                 },
                                 kMatmul16,
                                 0,
                                 matmul_16bit_available};
const OpDef kLinearBackwardWeight{"linear_backward_weight",
                                  linear_backward_weight_cpu,
                                  nullptr,
                                  [](const Graph& g, const Node& n) {
                                    const Shape& dys = g.value(n.inputs[0]).shape;
                                    return 2.0 * double(dys.rows()) * double(dys.last()) *
                                           double(g.value(n.inputs[1]).shape.last());
                                  },
                                  kMatmul16,
                                  0,
                                  matmul_16bit_available};

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
