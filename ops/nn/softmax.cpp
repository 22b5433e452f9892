#include "nn/softmax.h"
#include "cuda_kernels.h"

#include <algorithm>
#include <cmath>

namespace engine::ops {

namespace {

void softmax_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  const float* x = ctx.f32(node.inputs[0]);
  float* y = ctx.f32(node.outputs[0]);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, xr[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(xr[i]) - mx);
    for (int64_t i = 0; i < n; ++i) yr[i] = float(std::exp(double(xr[i]) - mx) / sum);
  }
}

// inputs y, dy; output dx
void softmax_backward_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  const float* y = ctx.f32(node.inputs[0]);
  const float* dy = ctx.f32(node.inputs[1]);
  float* dx = ctx.f32(node.outputs[0]);
  const bool accumulate = ctx.accumulates(node, 0);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t i = 0; i < n; ++i) dot += double(y[r * n + i]) * dy[r * n + i];
    for (int64_t i = 0; i < n; ++i) store(&dx[r * n + i], float(y[r * n + i] * (dy[r * n + i] - dot)), accumulate);
  }
}

void softmax_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kSoftmaxBackward, {node.outputs[0], dy}, {t.value}, t, {}, node.name);
}

double softmax_flops(const Graph& g, const Node& n) { return 5.0 * double(g.value(n.inputs[0]).shape.numel()); }

}  // namespace

const OpDef kSoftmax{.name = "softmax",
                     .cpu = softmax_cpu,
                     .cuda = cuda::softmax,
                     .grad = softmax_grad,
                     .flops = softmax_flops,
                     .cuda_16bit = "16-bit rows read and written directly, fp32 and double arithmetic"};
const OpDef kSoftmaxBackward{.name = "softmax_backward",
                             .cpu = softmax_backward_cpu,
                             .cuda = cuda::softmax_backward,
                             .flops = softmax_flops,
                             .cuda_16bit = "16-bit rows read and written directly, fp32 and double arithmetic"};

ValueId softmax(Graph& g, ValueId x, const std::string& name) {
  ValueId y = g.add_activation(name + ".out", g.value(x).shape);
  g.add_node(Node{&kSoftmax, {x}, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
