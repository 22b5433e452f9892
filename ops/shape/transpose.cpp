#include "shape/transpose.h"
#include "cuda_kernels.h"

namespace engine::ops {

namespace {

void transpose_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t m = s[s.rank() - 2], n = s.last(), batch = s.numel() / (m * n);
  const float* x = ctx.f32(node.inputs[0]);
  float* y = ctx.f32(node.outputs[0]);
  const bool accumulate = ctx.accumulates(node, 0);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) store(&y[b * m * n + j * m + i], x[b * m * n + i * n + j], accumulate);
}

void transpose_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kTranspose, {dy}, {t.value}, t, {}, node.name);
}

void reshape_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kReshape, {dy}, {t.value}, t, {}, node.name);
}

}  // namespace

const OpDef kTranspose{.name = "transpose", .cpu = transpose_cpu, .cuda = cuda::transpose, .grad = transpose_grad};
const OpDef kReshape{.name = "reshape",
                     .cpu = copy_kernel,
                     .cuda = cuda::copy,
                     .grad = reshape_grad,
                     .native_16bit = "a copy in the stored type",
                     .cuda_16bit = "a copy in the stored type"};

ValueId transpose(Graph& g, ValueId x, const std::string& name) {
  const Shape& s = g.value(x).shape;
  if (s.rank() < 2) shape_error(name, "transpose needs at least 2 dimensions, got " + s.str());
  std::vector<int64_t> dims = s.dims;
  std::swap(dims[dims.size() - 1], dims[dims.size() - 2]);
  ValueId y = g.add_activation(name + ".out", Shape(dims));
  g.add_node(Node{&kTranspose, {x}, {y}, {}, false, false, name});
  return y;
}

ValueId reshape(Graph& g, ValueId x, Shape shape, const std::string& name) {
  if (shape.numel() != g.value(x).shape.numel())
    shape_error(name, "cannot reshape " + g.value(x).shape.str() + " to " + shape.str());
  ValueId y = g.add_activation(name + ".out", std::move(shape));
  g.add_node(Node{&kReshape, {x}, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
