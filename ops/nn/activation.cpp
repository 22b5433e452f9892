#include "nn/activation.h"

#include <type_traits>

#include "cuda_kernels.h"
#include "elementwise/widened.h"
#include "nn/gelu_onednn.h"

namespace engine::ops {

namespace {

constexpr const char* kCuda16 = "16-bit values read and written directly (16-byte vector loads), fp32 arithmetic";
constexpr const char* kCudaSwiglu16 = "16-bit values read and written directly, fp32 arithmetic";

// GELU goes through oneDNN (nn/gelu_onednn.h) when its operands share a type and it overwrites its
// output, for tensors big enough that the primitive's call costs nothing next to the work.
constexpr int64_t kOnednnGeluElements = 16384;
template <class F>
bool through_onednn(const Node& node, const KernelContext& ctx, bool accumulate) {
  if constexpr (!std::is_same_v<F, Gelu>) {
    return false;
  } else {
    const int64_t n = ctx.shape(node.inputs[0]).numel();
    const DType type = ctx.dtype(node.inputs[0]);
    for (ValueId id : node.inputs)
      if (ctx.dtype(id) != type) return false;
    if (accumulate || n < kOnednnGeluElements || ctx.dtype(node.outputs[0]) != type) return false;
    return node.inputs.size() == 1 ? onednn_gelu_forward(type, n, ctx.data(node.inputs[0]), ctx.data(node.outputs[0]))
                                   : onednn_gelu_backward(type, n, ctx.data(node.inputs[0]), ctx.data(node.inputs[1]),
                                                          ctx.data(node.outputs[0]));
  }
}

template <class F>
void unary_cpu(const Node& node, const KernelContext& ctx) {
  if (through_onednn<F>(node, ctx, false)) return;
  if (!all_f32(ctx, {node.inputs[0], node.outputs[0]}))
    return for_each_chunk<1, 1>(ctx, {node.inputs[0]}, {node.outputs[0]}, {false}, ctx.shape(node.inputs[0]).numel(),
                                [](const float* const* in, float* const* out, int64_t, int64_t count) {
                                  const float* x = in[0];
                                  float* y = out[0];
#pragma omp simd
                                  for (int64_t i = 0; i < count; ++i) y[i] = F::forward(x[i]);
                                });
  const float* x = ctx.f32(node.inputs[0]);
  float* y = ctx.f32(node.outputs[0]);
  int64_t n = ctx.shape(node.inputs[0]).numel();
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
  for (int64_t i = 0; i < n; ++i) y[i] = F::forward(x[i]);
}

// inputs x, dy; output dx
template <class F>
void unary_backward_cpu(const Node& node, const KernelContext& ctx) {
  if (through_onednn<F>(node, ctx, ctx.accumulates(node, 0))) return;
  if (!all_f32(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}))
    return for_each_chunk<2, 1>(ctx, {node.inputs[0], node.inputs[1]}, {node.outputs[0]}, {ctx.accumulates(node, 0)},
                                ctx.shape(node.inputs[0]).numel(),
                                [](const float* const* in, float* const* out, int64_t, int64_t count) {
                                  const float* x = in[0];
                                  const float* dy = in[1];
                                  float* dx = out[0];
#pragma omp simd
                                  for (int64_t i = 0; i < count; ++i) dx[i] = F::derivative(x[i]) * dy[i];
                                });
  const float* x = ctx.f32(node.inputs[0]);
  const float* dy = ctx.f32(node.inputs[1]);
  float* dx = ctx.f32(node.outputs[0]);
  int64_t n = ctx.shape(node.inputs[0]).numel();
  if (ctx.accumulates(node, 0)) {
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
    for (int64_t i = 0; i < n; ++i) dx[i] = accumulate_product(dx[i], F::derivative(x[i]), dy[i]);
  } else {
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
    for (int64_t i = 0; i < n; ++i) dx[i] = F::derivative(x[i]) * dy[i];
  }
}

template <const OpDef* Backward>
void unary_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto t = gb.target(node.inputs[0]);
  gb.emit(*Backward, {node.inputs[0], dy}, {t.value}, t, {}, node.name);
}

ValueId unary(Graph& g, const OpDef& op, ValueId x, const std::string& name) {
  ValueId y = g.add_activation(name + ".out", g.value(x).shape);
  g.add_node(Node{&op, {x}, {y}, {}, false, false, name});
  return y;
}

void swiglu_cpu(const Node& node, const KernelContext& ctx) {
  if (!all_f32(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}))
    return for_each_chunk<2, 1>(ctx, {node.inputs[0], node.inputs[1]}, {node.outputs[0]}, {false},
                                ctx.shape(node.inputs[0]).numel(),
                                [](const float* const* in, float* const* out, int64_t, int64_t count) {
                                  const float* a = in[0];
                                  const float* b = in[1];
                                  float* y = out[0];
#pragma omp simd
                                  for (int64_t i = 0; i < count; ++i) y[i] = swiglu_forward(a[i], b[i]);
                                });
  const float* a = ctx.f32(node.inputs[0]);
  const float* b = ctx.f32(node.inputs[1]);
  float* y = ctx.f32(node.outputs[0]);
  int64_t n = ctx.shape(node.inputs[0]).numel();
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
  for (int64_t i = 0; i < n; ++i) y[i] = swiglu_forward(a[i], b[i]);
}

// inputs a, b, dy; outputs da, db (each written or accumulated per its own target)
void swiglu_backward_cpu(const Node& node, const KernelContext& ctx) {
  bool acc_a = node.attrs.ints[0] != 0, acc_b = node.attrs.ints[1] != 0;
  if (!all_f32(ctx, {node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0], node.outputs[1]}))
    return for_each_chunk<3, 2>(ctx, {node.inputs[0], node.inputs[1], node.inputs[2]},
                                {node.outputs[0], node.outputs[1]}, {acc_a, acc_b}, ctx.shape(node.inputs[0]).numel(),
                                [](const float* const* in, float* const* out, int64_t, int64_t count) {
                                  const float* a = in[0];
                                  const float* b = in[1];
                                  const float* dy = in[2];
                                  float* da = out[0];
                                  float* db = out[1];
#pragma omp simd
                                  for (int64_t i = 0; i < count; ++i) {
                                    da[i] = swiglu_grad_a(a[i], b[i], dy[i]);
                                    db[i] = swiglu_grad_b(a[i], dy[i]);
                                  }
                                });
  const float* a = ctx.f32(node.inputs[0]);
  const float* b = ctx.f32(node.inputs[1]);
  const float* dy = ctx.f32(node.inputs[2]);
  float* da = ctx.f32(node.outputs[0]);
  float* db = ctx.f32(node.outputs[1]);
  int64_t n = ctx.shape(node.inputs[0]).numel();
#pragma omp parallel for simd schedule(static) if (n > kSerialElements)
  for (int64_t i = 0; i < n; ++i) {
    // An accumulated gradient is added after rounding (GCC keeps these products unfused).
    float va = swiglu_grad_a(a[i], b[i], dy[i]);
    float vb = swiglu_grad_b(a[i], dy[i]);
    da[i] = acc_a ? da[i] + va : va;
    db[i] = acc_b ? db[i] + vb : vb;
  }
}

void swiglu_grad(GradBuilder& gb, const Node& node) {
  ValueId dy = gb.grad(node.outputs[0]);
  if (dy == kNoValue) return;
  auto ta = gb.target(node.inputs[0]);
  auto tb = gb.target(node.inputs[1]);
  gb.graph().add_node(Node{&kSwigluBackward,
                           {node.inputs[0], node.inputs[1], dy},
                           {ta.value, tb.value},
                           Attrs{{ta.accumulate ? 1 : 0, tb.accumulate ? 1 : 0}, {}},
                           false,
                           true,
                           node.name});
}

}  // namespace

const OpDef kGelu{.name = "gelu",
                  .cpu = unary_cpu<Gelu>,
                  .cuda = cuda::gelu,
                  .grad = unary_grad<&kGeluBackward>,
                  .flops = elementwise_flops,
                  .native_16bit = kWidenedChunks,
                  .cuda_16bit = kCuda16,
                  .cheap_to_recompute = true};
const OpDef kGeluBackward{.name = "gelu_backward",
                          .cpu = unary_backward_cpu<Gelu>,
                          .cuda = cuda::gelu_backward,
                          .flops = elementwise_flops,
                          .native_16bit = kWidenedChunks,
                          .cuda_16bit = kCuda16};
const OpDef kRelu{.name = "relu",
                  .cpu = unary_cpu<Relu>,
                  .cuda = cuda::relu,
                  .grad = unary_grad<&kReluBackward>,
                  .flops = elementwise_flops,
                  .native_16bit = kWidenedChunks,
                  .cuda_16bit = kCuda16,
                  .cheap_to_recompute = true};
const OpDef kReluBackward{.name = "relu_backward",
                          .cpu = unary_backward_cpu<Relu>,
                          .cuda = cuda::relu_backward,
                          .flops = elementwise_flops,
                          .native_16bit = kWidenedChunks,
                          .cuda_16bit = kCuda16};
const OpDef kSilu{.name = "silu",
                  .cpu = unary_cpu<Silu>,
                  .cuda = cuda::silu,
                  .grad = unary_grad<&kSiluBackward>,
                  .flops = elementwise_flops,
                  .native_16bit = kWidenedChunks,
                  .cuda_16bit = kCuda16,
                  .cheap_to_recompute = true};
const OpDef kSiluBackward{.name = "silu_backward",
                          .cpu = unary_backward_cpu<Silu>,
                          .cuda = cuda::silu_backward,
                          .flops = elementwise_flops,
                          .native_16bit = kWidenedChunks,
                          .cuda_16bit = kCuda16};
const OpDef kSwiglu{.name = "swiglu",
                    .cpu = swiglu_cpu,
                    .cuda = cuda::swiglu,
                    .grad = swiglu_grad,
                    .flops = elementwise_flops,
                    .native_16bit = kWidenedChunks,
                    .cuda_16bit = kCudaSwiglu16,
                    .cheap_to_recompute = true};
const OpDef kSwigluBackward{.name = "swiglu_backward",
                            .cpu = swiglu_backward_cpu,
                            .cuda = cuda::swiglu_backward,
                            .flops = elementwise_flops,
                            .native_16bit = kWidenedChunks,
                            .cuda_16bit = kCudaSwiglu16};

ValueId gelu(Graph& g, ValueId x, const std::string& name) { return unary(g, kGelu, x, name); }
ValueId relu(Graph& g, ValueId x, const std::string& name) { return unary(g, kRelu, x, name); }
ValueId silu(Graph& g, ValueId x, const std::string& name) { return unary(g, kSilu, x, name); }

ValueId swiglu(Graph& g, ValueId a, ValueId b, const std::string& name) {
  if (g.value(a).shape != g.value(b).shape)
    shape_error(name, "gate " + g.value(a).shape.str() + " and value " + g.value(b).shape.str() + " differ");
  ValueId y = g.add_activation(name + ".out", g.value(a).shape);
  g.add_node(Node{&kSwiglu, {a, b}, {y}, {}, false, false, name});
  return y;
}

}  // namespace engine::ops
