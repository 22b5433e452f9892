#include "reduce/sum.h"
#include "cuda_kernels.h"

namespace engine::ops {

namespace {

// attrs.floats[0]: the factor (1 for a sum, 1/N for a mean)
void reduce_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  const float* x = ctx.f32(node.inputs[0]);
  float* y = ctx.f32(node.outputs[0]);
  const double factor = node.attrs.floats[0];
  // Each row in order, in double: reduce/sum.cu sums a row on one thread in the same order.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += x[r * n + i];
    y[r] = float(sum * factor);
  }
}

// inputs dy (...); output dx (..., N)
void reduce_backward_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.outputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  const float* dy = ctx.f32(node.inputs[0]);
  float* dx = ctx.f32(node.outputs[0]);
  const auto factor = float(node.attrs.floats[0]);
  const bool accumulate = ctx.accumulates(node, 0);
  // The product once per row: GCC would fuse it into the accumulating add in some iterations (a loop
  // tail's) and not others; the CUDA kernel (reduce/sum.cu) adds the same rounded product.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float v = dy[r] * factor;
    for (int64_t i = 0; i < n; ++i) store(&dx[r * n + i], v, accumulate);
  }
}

void reduce_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kReduceBackward, {dy}, {t.value}, t, node.attrs, node.name);
}

ValueId reduce(Graph& g, ValueId x, bool mean, const std::string& name) {
  const Shape& s = g.value(x).shape;
  if (s.rank() < 1) shape_error(name, "cannot reduce a scalar");
  std::vector<int64_t> dims(s.dims.begin(), s.dims.end() - 1);
  if (dims.empty()) dims.push_back(1);
  ValueId y = g.add_activation(name + ".out", Shape(dims));
  g.add_node(Node{&kReduceSum, {x}, {y}, Attrs{{}, {mean ? 1.0 / double(s.last()) : 1.0}}, false, false, name});
  return y;
}

}  // namespace

const OpDef kReduceSum{.name = "reduce_sum",
                       .cpu = reduce_cpu,
                       .cuda = cuda::reduce_sum,
                       .grad = reduce_grad,
                       .flops = elementwise_flops,
                       .fp32_outputs = 0b1};  // output 0: the sum
const OpDef kReduceBackward{
    .name = "reduce_backward", .cpu = reduce_backward_cpu, .cuda = cuda::reduce_backward, .flops = elementwise_flops};

ValueId reduce_sum(Graph& g, ValueId x, const std::string& name) { return reduce(g, x, false, name); }
ValueId reduce_mean(Graph& g, ValueId x, const std::string& name) { return reduce(g, x, true, name); }

}  // namespace engine::ops
