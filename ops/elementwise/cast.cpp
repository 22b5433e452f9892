#include "elementwise/cast.h"

#include <cstring>

#include "cuda_kernels.h"
#include "elementwise/widened.h"

namespace engine::ops {

namespace {

void cast_cpu(const Node& node, const KernelContext& ctx) {
  for_each_chunk<1, 1>(ctx, {node.inputs[0]}, {node.outputs[0]}, {ctx.accumulates(node, 0)},
                       ctx.shape(node.inputs[0]).numel(),
                       [](const float* const* in, float* const* out, int64_t, int64_t count) {
                         std::memcpy(out[0], in[0], size_t(count) * sizeof(float));
                       });
}

void cast_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(kCast, {dy}, {t.value}, t, {}, node.name);
}

}  // namespace

const OpDef kCast{.name = "cast",
                  .cpu = cast_cpu,
                  .cuda = cuda::cast,
                  .grad = cast_grad,
                  .flops = elementwise_flops,
                  .native_16bit = "reads and writes any float type",
                  .cuda_16bit = "reads and writes any float type"};

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
