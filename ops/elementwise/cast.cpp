#include "elementwise/cast.h"

#include "core/convert.h"

namespace engine::ops {

namespace {

void cast_cpu(const Node& node, const KernelContext& ctx) {
  const Tensor in = ctx.tensor(node.inputs[0]);
  const Tensor out = ctx.tensor(node.outputs[0]);
  const void* x = in.data;
  void* y = out.data;
  const int64_t n = in.numel();
  const bool accumulate = ctx.accumulates(node, 0);
  const DType from = in.dtype, to = out.dtype;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    float v = load_float(x, from, i);
    if (accumulate) v += load_float(y, to, i);
    switch (to) {
      case DType::bf16:
        static_cast<uint16_t*>(y)[i] = float_to_bf16(v);
        break;
      case DType::f16:
        static_cast<uint16_t*>(y)[i] = float_to_f16(v);
        break;
      default:
        static_cast<float*>(y)[i] = v;
        break;
    }
  }
}

void cast_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kCast, {dy}, {t.value}, t, {}, node.name);
}

}  // namespace

const OpDef kCast{"cast", cast_cpu, cast_grad, elementwise_flops, "reads and writes any float type"};

ValueId cast(Graph& g, ValueId x, DType dtype, const std::string& name) {
  auto floating = [](DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; };
  if (!floating(g.value(x).dtype) || !floating(dtype))
    shape_error(name, "cast converts between f32, bf16 and f16, not " + std::string(dtype_name(g.value(x).dtype)) +
                          " to " + std::string(dtype_name(dtype)));
  ValueId y = g.add_activation(name + ".out", g.value(x).shape, dtype);
  g.add_node(Node{&kCast, {x}, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
