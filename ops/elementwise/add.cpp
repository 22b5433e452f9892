#include "elementwise/add.h"

#include "cuda_kernels.h"
#include "elementwise/add_math.h"
#include "elementwise/widened.h"

namespace engine::ops {

namespace {

void add_cpu(const Node& node, const KernelContext& ctx) {
  if (!all_f32(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}))
    return for_each_chunk<2, 1>(ctx, {node.inputs[0], node.inputs[1]}, {node.outputs[0]}, {false},
                                ctx.shape(node.inputs[0]).numel(),
                                [](const float* const* in, float* const* out, int64_t, int64_t count) {
                                  const float* a = in[0];
                                  const float* b = in[1];
                                  float* y = out[0];
#pragma omp simd
                                  for (int64_t i = 0; i < count; ++i) y[i] = add_values(a[i], b[i]);
                                });
  const float* a = ctx.f32(node.inputs[0]);
  const float* b = ctx.f32(node.inputs[1]);
  float* y = ctx.f32(node.outputs[0]);
  int64_t n = ctx.shape(node.inputs[0]).numel();
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
  for (int64_t i = 0; i < n; ++i) y[i] = add_values(a[i], b[i]);
}

void add_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  gb.pass_through(node.inputs[0], dy, node.name);
  gb.pass_through(node.inputs[1], dy, node.name);
}

}  // namespace

const OpDef kAdd{.name = "add",
                 .cpu = add_cpu,
                 .cuda = cuda::add,
                 .grad = add_grad,
                 .flops = elementwise_flops,
                 .native_16bit = kWidenedChunks,
                 .cuda_16bit = "16-bit values read and written directly (16-byte vector loads), fp32 addition"};

ValueId add(Graph& g, ValueId a, ValueId b, const std::string& name) {
  if (g.value(a).shape != g.value(b).shape)
    shape_error(name, "cannot add " + g.value(a).shape.str() + " and " + g.value(b).shape.str());
  ValueId y = g.add_activation(name + ".out", g.value(a).shape);
  g.add_node(Node{&kAdd, {a, b}, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
