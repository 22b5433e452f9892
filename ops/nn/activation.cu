// CUDA kernels of the pointwise activations (nn/activation.cpp), on f32 values (the executor widens
// 16-bit ones), calling the CPU kernels' functors (nn/activation_math.h): with -fmad=false they give
// the CPU loop's bits. (The CPU's GELU goes through oneDNN on AVX-512 machines, whose bits differ.)
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/activation_math.h"

namespace engine::cuda {

namespace {

template <class F>
__global__ void forward_kernel(const float* x, float* y, int64_t n) {  // (n,) each
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = F::forward(x[i]);
}

// dx (+)= F'(x) dy, an accumulated one fused as the CPU loop's.
template <class F>
__global__ void backward_kernel(const float* x, const float* dy, float* dx, int64_t n, bool accumulate) {
  for (int64_t i = thread_index(); i < n; i += thread_stride())
    dx[i] = accumulate ? ops::accumulate_product(dx[i], F::derivative(x[i]), dy[i]) : F::derivative(x[i]) * dy[i];
}

__global__ void swiglu_kernel(const float* a, const float* b, float* y, int64_t n) {  // (n,) each
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = ops::swiglu_forward(a[i], b[i]);
}

// da (+)= silu'(a) b dy, db (+)= silu(a) dy; an accumulated gradient is added after rounding.
__global__ void swiglu_backward_kernel(const float* a, const float* b, const float* dy, float* da, float* db,
                                       int64_t n, bool accumulate_a, bool accumulate_b) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float va = ops::swiglu_grad_a(a[i], b[i], dy[i]);
    const float vb = ops::swiglu_grad_b(a[i], dy[i]);
    da[i] = accumulate_a ? da[i] + va : va;
    db[i] = accumulate_b ? db[i] + vb : vb;
  }
}

template <class F>
void unary(const Node& node, const KernelContext& ctx, const char* name) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  forward_kernel<F><<<blocks_for(n), kThreads, 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), n);
  check_launch(name);
}

// inputs x, dy; output dx
template <class F>
void unary_backward(const Node& node, const KernelContext& ctx, const char* name) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  backward_kernel<F><<<blocks_for(n), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]), ctx.f32(node.outputs[0]), n, ctx.accumulates(node, 0));
  check_launch(name);
}

}  // namespace

void gelu(const Node& node, const KernelContext& ctx) { unary<ops::Gelu>(node, ctx, "gelu"); }
void gelu_backward(const Node& node, const KernelContext& ctx) { unary_backward<ops::Gelu>(node, ctx, "gelu_backward"); }
void relu(const Node& node, const KernelContext& ctx) { unary<ops::Relu>(node, ctx, "relu"); }
void relu_backward(const Node& node, const KernelContext& ctx) { unary_backward<ops::Relu>(node, ctx, "relu_backward"); }
void silu(const Node& node, const KernelContext& ctx) { unary<ops::Silu>(node, ctx, "silu"); }
void silu_backward(const Node& node, const KernelContext& ctx) { unary_backward<ops::Silu>(node, ctx, "silu_backward"); }

void swiglu(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  swiglu_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]),
                                                             ctx.f32(node.outputs[0]), n);
  check_launch("swiglu");
}

// inputs a, b, dy; outputs da, db; attrs.ints: whether each accumulates (as the CPU kernel reads them)
void swiglu_backward(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  swiglu_backward_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]), ctx.f32(node.inputs[2]), ctx.f32(node.outputs[0]),
      ctx.f32(node.outputs[1]), n, node.attrs.ints[0] != 0, node.attrs.ints[1] != 0);
  check_launch("swiglu_backward");
}

}  // namespace engine::cuda
