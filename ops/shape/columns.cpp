#include "shape/columns.h"

#include <cstring>

#include "core/convert.h"

#include "cuda_kernels.h"
#include "graph/autodiff.h"

namespace engine::ops {

namespace {

void add_columns_cpu(const Node& node, const KernelContext& ctx) {
  const int64_t offset = node.attrs.ints[0], width = node.attrs.ints[1];
  const auto scale = float(node.attrs.floats[0]);
  const int64_t columns = ctx.shape(node.inputs[0]).last(), rows = ctx.shape(node.inputs[0]).numel() / columns;
  const float* y = ctx.f32(node.inputs[0]);
  const float* d = ctx.f32(node.inputs[1]);
  float* out = ctx.f32(node.outputs[0]);
#pragma omp parallel for schedule(static) if (rows * columns > kSerialElements)
  for (int64_t r = 0; r < rows; ++r) {
    if (out != y) std::memcpy(out + r * columns, y + r * columns, size_t(columns) * sizeof(float));
    for (int64_t j = 0; j < width; ++j) out[r * columns + offset + j] += scale * d[r * width + j];
  }
}

void take_columns_cpu(const Node& node, const KernelContext& ctx) {
  const int64_t offset = node.attrs.ints[0], width = node.attrs.ints[1];
  const auto scale = float(node.attrs.floats[0]);
  const int64_t columns = ctx.shape(node.inputs[0]).last(), rows = ctx.shape(node.inputs[0]).numel() / columns;
  const float* x = ctx.f32(node.inputs[0]);
  float* out = ctx.f32(node.outputs[0]);
  const bool accumulate = ctx.accumulates(node, 0);
#pragma omp parallel for schedule(static) if (rows * width > kSerialElements)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < width; ++j) store(&out[r * width + j], scale * x[r * columns + offset + j], accumulate);
}

void add_columns_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  gb.pass_through(node.inputs[0], dy, node.name);
  if (!gb.wants(node.inputs[1])) return;
  auto t = gb.target(node.inputs[1]);
  gb.emit(kTakeColumns, {dy}, {t.value}, t, node.attrs, node.name);
}

double add_columns_flops(const Graph& g, const Node& n) { return 2.0 * double(g.value(n.inputs[1]).shape.numel()); }
double take_columns_flops(const Graph& g, const Node& n) { return double(g.value(n.outputs[0]).shape.numel()); }

}  // namespace

const OpDef kAddColumns{.name = "add_columns",
                        .cpu = add_columns_cpu,
                        .cuda = cuda::add_columns,
                        .grad = add_columns_grad,
                        .flops = add_columns_flops};
const OpDef kTakeColumns{
    .name = "take_columns", .cpu = take_columns_cpu, .cuda = cuda::take_columns, .flops = take_columns_flops};

ValueId add_columns(Graph& g, ValueId y, ValueId d, int64_t offset, double scale, const std::string& name) {
  const Shape& ys = g.value(y).shape;
  const Shape& ds = g.value(d).shape;
  if (ys.rank() != ds.rank() || ys.rank() == 0 ||
      ys.numel() / ys.last() != ds.numel() / std::max<int64_t>(1, ds.last()))
    shape_error(name, "cannot add " + ds.str() + " into the columns of " + ys.str());
  if (offset < 0 || offset + ds.last() > ys.last())
    shape_error(name, "columns [" + std::to_string(offset) + ", " + std::to_string(offset + ds.last()) +
                          ") are outside " + ys.str());
  ValueId out = g.add_activation(name + ".out", ys);
  g.add_node(Node{&kAddColumns, {y, d}, {out}, {{offset, ds.last()}, {scale}}, false, false, name});
  return out;
}

ValueId take_columns(Graph& g, ValueId x, int64_t offset, int64_t width, double scale, const std::string& name) {
  const Shape& xs = g.value(x).shape;
  if (xs.rank() == 0 || offset < 0 || width < 1 || offset + width > xs.last())
    shape_error(name, "columns [" + std::to_string(offset) + ", " + std::to_string(offset + width) + ") are outside " +
                          xs.str());
  std::vector<int64_t> dims = xs.dims;
  dims.back() = width;
  ValueId out = g.add_activation(name + ".out", Shape(dims));
  g.add_node(Node{&kTakeColumns, {x}, {out}, {{offset, width}, {scale}}, false, false, name});
  return out;
}

}  // namespace engine::ops
