// CUDA kernels of the pointwise activations (nn/activation.cpp), on f32, bf16 or f16 values read and
// written in their own types (fp32 arithmetic, each output rounded once: the bits of the executor's
// widening and rounding), calling the CPU kernels' functors (nn/activation_math.h): with -fmad=false they give
// the CPU loop's bits. (The CPU's GELU goes through oneDNN on AVX-512 machines, whose bits differ.)
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/activation_math.h"

namespace engine::cuda {

namespace {

// Each kernel: T the storage type of every operand (float, __nv_bfloat16, __half; void: mixed, each
// read by its own type). Where the arrays are 16-byte aligned, a thread takes packs of 16 bytes
// (vector loads and stores), the elements past the last whole pack one by one.

template <class T, class F>
__global__ void forward_kernel(FloatArray<T> x, FloatArray<T> y, int64_t n, bool packed) {  // (n,) each
  int64_t done = 0;
  if constexpr (!std::is_void_v<T>) {
    constexpr int k = kPack<T>;
    if (packed) {
      done = n / k * k;
      for (int64_t p = thread_index() * k; p < done; p += thread_stride() * k) {
        float v[k];
        load_pack(x.p, p, v);
#pragma unroll
        for (int j = 0; j < k; ++j) v[j] = F::forward(v[j]);
        store_pack(y.p, p, v);
      }
    }
  }
  for (int64_t i = done + thread_index(); i < n; i += thread_stride()) y.store(i, F::forward(x.load(i)));
}

// dx (+)= F'(x) dy, an accumulated one fused as the CPU loop's.
template <class F>
__device__ inline float backward_value(float x, float dy, float dx, bool accumulate) {
  return accumulate ? ops::accumulate_product(dx, F::derivative(x), dy) : F::derivative(x) * dy;
}
template <class T, class F>
__global__ void backward_kernel(FloatArray<T> x, FloatArray<T> dy, FloatArray<T> dx, int64_t n, bool accumulate,
                                bool packed) {
  int64_t done = 0;
  if constexpr (!std::is_void_v<T>) {
    constexpr int k = kPack<T>;
    if (packed) {
      done = n / k * k;
      for (int64_t p = thread_index() * k; p < done; p += thread_stride() * k) {
        float vx[k], vdy[k], vdx[k];
        load_pack(x.p, p, vx);
        load_pack(dy.p, p, vdy);
        if (accumulate) load_pack(dx.p, p, vdx);
#pragma unroll
        for (int j = 0; j < k; ++j) vdx[j] = backward_value<F>(vx[j], vdy[j], accumulate ? vdx[j] : 0.0f, accumulate);
        store_pack(dx.p, p, vdx);
      }
    }
  }
  for (int64_t i = done + thread_index(); i < n; i += thread_stride())
    dx.store(i, backward_value<F>(x.load(i), dy.load(i), accumulate ? dx.load(i) : 0.0f, accumulate));
}

template <class T>
__global__ void swiglu_kernel(FloatArray<T> a, FloatArray<T> b, FloatArray<T> y, int64_t n) {  // (n,) each
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y.store(i, ops::swiglu_forward(a.load(i), b.load(i)));
}

// da (+)= silu'(a) b dy, db (+)= silu(a) dy; an accumulated gradient is added after rounding.
template <class T>
__global__ void swiglu_backward_kernel(FloatArray<T> a, FloatArray<T> b, FloatArray<T> dy, FloatArray<T> da,
                                       FloatArray<T> db, int64_t n, bool accumulate_a, bool accumulate_b) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float va_ = a.load(i), vb_ = b.load(i), vdy = dy.load(i);
    const float va = ops::swiglu_grad_a(va_, vb_, vdy);
    const float vb = ops::swiglu_grad_b(va_, vdy);
    da.store(i, accumulate_a ? da.load(i) + va : va);
    db.store(i, accumulate_b ? db.load(i) + vb : vb);
  }
}

// Whether the values of `ids` are 16-byte aligned (the packed loops).
bool all_aligned(const KernelContext& ctx, std::initializer_list<ValueId> ids) {
  for (ValueId id : ids)
    if (!pack_aligned(ctx.data(id))) return false;
  return true;
}
// Blocks for n elements taken k at a time where packed.
unsigned pack_blocks(int64_t n, int k, bool packed) { return blocks_for(packed ? (n + k - 1) / k : n); }

template <class F>
void unary(const Node& node, const KernelContext& ctx, const char* name) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  const ValueId x = node.inputs[0], y = node.outputs[0];
  with_float_type(ctx, {x, y}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int k = kPack<T>;
    const bool packed = !std::is_void_v<T> && all_aligned(ctx, {x, y});
    forward_kernel<T, F><<<pack_blocks(n, k, packed), kThreads, 0, stream(ctx)>>>(float_array<T>(ctx, x),
                                                                                  float_array<T>(ctx, y), n, packed);
  });
  check_launch(name);
}

// inputs x, dy; output dx
template <class F>
void unary_backward(const Node& node, const KernelContext& ctx, const char* name) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  const ValueId x = node.inputs[0], dy = node.inputs[1], dx = node.outputs[0];
  with_float_type(ctx, {x, dy, dx}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int k = kPack<T>;
    const bool packed = !std::is_void_v<T> && all_aligned(ctx, {x, dy, dx});
    backward_kernel<T, F><<<pack_blocks(n, k, packed), kThreads, 0, stream(ctx)>>>(
        float_array<T>(ctx, x), float_array<T>(ctx, dy), float_array<T>(ctx, dx), n, ctx.accumulates(node, 0), packed);
  });
  check_launch(name);
}

}  // namespace

void gelu(const Node& node, const KernelContext& ctx) { unary<ops::Gelu>(node, ctx, "gelu"); }
void gelu_backward(const Node& node, const KernelContext& ctx) {
  unary_backward<ops::Gelu>(node, ctx, "gelu_backward");
}
void relu(const Node& node, const KernelContext& ctx) { unary<ops::Relu>(node, ctx, "relu"); }
void relu_backward(const Node& node, const KernelContext& ctx) {
  unary_backward<ops::Relu>(node, ctx, "relu_backward");
}
void silu(const Node& node, const KernelContext& ctx) { unary<ops::Silu>(node, ctx, "silu"); }
void silu_backward(const Node& node, const KernelContext& ctx) {
  unary_backward<ops::Silu>(node, ctx, "silu_backward");
}

void swiglu(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  with_float_type(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    swiglu_kernel<T><<<blocks_for(n), kThreads, 0, stream(ctx)>>>(float_array<T>(ctx, node.inputs[0]),
                                                                  float_array<T>(ctx, node.inputs[1]),
                                                                  float_array<T>(ctx, node.outputs[0]), n);
  });
  check_launch("swiglu");
}

// inputs a, b, dy; outputs da, db; attrs.ints: whether each accumulates (as the CPU kernel reads them)
void swiglu_backward(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  with_float_type(ctx, {node.inputs[0], node.inputs[1], node.inputs[2], node.outputs[0], node.outputs[1]},
                  [&](auto tag) {
                    using T = typename decltype(tag)::type;
                    swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream(ctx)>>>(
                        float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.inputs[1]),
                        float_array<T>(ctx, node.inputs[2]), float_array<T>(ctx, node.outputs[0]),
                        float_array<T>(ctx, node.outputs[1]), n, node.attrs.ints[0] != 0, node.attrs.ints[1] != 0);
                  });
  check_launch("swiglu_backward");
}

}  // namespace engine::cuda
