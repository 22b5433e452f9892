// CUDA kernels of rotary and its backward (CPU: rotate in nn/rotary.cpp), on packed qkv (the layout
// of nn/qkv_layout.h: H query heads, KV key heads, KV value heads, each hd wide) in f32, bf16 or f16,
// read and written in its own type (fp32 arithmetic, each output rounded once: the bits of the
// executor's widening and rounding; T the common type of input and output, void where they differ).
//
// The angles' cosines and sines are computed once per (t, i) in double, as the CPU does, into a
// (T, hd/2) table in the workspace; then one thread per rotated pair (the q and k heads) and one
// per copied v element. direction -1 rotates back (the backward).
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/rotary.h"

namespace engine::cuda {

namespace {

__global__ void angle_table_kernel(float* cosines, float* sines,  // (T, half)
                                   int64_t time, int64_t half, int64_t hd, ops::RopeFrequencies frequencies,
                                   float direction) {
  for (int64_t k = thread_index(); k < time * half; k += thread_stride()) {
    const int64_t t = k / half, i = k % half;
    const double inv_freq = ops::rope_inverse_frequency(frequencies, i, hd);
    const double angle = double(t) * inv_freq;
    cosines[k] = float(cos(angle));
    sines[k] = direction * float(sin(angle));
  }
}

template <class T>
__global__ void rotate_kernel(FloatArray<T> in,                          // (B, T, row)
                              FloatArray<T> out,                         // (B, T, row)
                              const float* cosines, const float* sines,  // (T, half)
                              int64_t rows, int64_t time, int64_t row, int64_t rotated_heads, int64_t half,
                              bool accumulate) {
  const int64_t hd = 2 * half, pairs = rotated_heads * half;
  for (int64_t k = thread_index(); k < rows * pairs; k += thread_stride()) {
    const int64_t bt = k / pairs, p = k % pairs, h = p / half, i = p % half, t = bt % time;
    const int64_t at = bt * row + h * hd + i;
    const float cs = cosines[t * half + i], sn = sines[t * half + i];
    const float x0 = in.load(at), x1 = in.load(at + half);
    const float a = x0 * cs - x1 * sn;
    const float b = x0 * sn + x1 * cs;
    out.store(at, accumulate ? out.load(at) + a : a);
    out.store(at + half, accumulate ? out.load(at + half) + b : b);
  }
}

template <class T>
__global__ void copy_values_kernel(FloatArray<T> in, FloatArray<T> out,  // (B, T, row): columns [rotated, row)
                                   int64_t rows, int64_t row, int64_t rotated, bool accumulate) {
  const int64_t width = row - rotated;
  for (int64_t k = thread_index(); k < rows * width; k += thread_stride()) {
    const int64_t at = (k / width) * row + rotated + k % width;
    out.store(at, accumulate ? out.load(at) + in.load(at) : in.load(at));
  }
}

void rotate(const Node& node, const KernelContext& ctx, float direction) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t heads = node.attrs.ints[0], kv_heads = node.attrs.ints[1];
  const int64_t batch = s[0], time = s[1], row = s[2], hd = row / (heads + 2 * kv_heads), half = hd / 2;
  const int64_t rows = batch * time, rotated = (heads + kv_heads) * hd;
  if (rows == 0 || row == 0) return;
  const size_t table_bytes = size_t(time * half) * sizeof(float);
  if (2 * table_bytes > ctx.workspace_bytes || (half > 0 && ctx.workspace == nullptr))
    throw InternalError("rotary: the workspace is smaller than the angle table (" + std::to_string(2 * table_bytes) +
                        " bytes)");
  const bool accumulate = ctx.accumulates(node, 0);
  if (half > 0) {
    auto* cosines = static_cast<float*>(ctx.workspace);
    float* sines = cosines + time * half;
    angle_table_kernel<<<blocks_for(time * half), kThreads, 0, stream(ctx)>>>(
        cosines, sines, time, half, hd, ops::rope_frequencies(node.attrs), direction);
    check_launch("angle_table_kernel");
    with_float_type(ctx, {node.inputs[0], node.outputs[0]}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      rotate_kernel<T><<<blocks_for(rows * (heads + kv_heads) * half), kThreads, 0, stream(ctx)>>>(
          float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.outputs[0]), cosines, sines, rows, time, row,
          heads + kv_heads, half, accumulate);
    });
    check_launch("rotate_kernel");
  }
  if (row > rotated) {
    with_float_type(ctx, {node.inputs[0], node.outputs[0]}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      copy_values_kernel<T><<<blocks_for(rows * (row - rotated)), kThreads, 0, stream(ctx)>>>(
          float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.outputs[0]), rows, row, rotated, accumulate);
    });
    check_launch("copy_values_kernel");
  }
}

}  // namespace

// input qkv; output qkv with q and k rotated
void rotary(const Node& node, const KernelContext& ctx) { rotate(node, ctx, 1.0f); }
// input dy; output dqkv (the opposite rotation)
void rotary_backward(const Node& node, const KernelContext& ctx) { rotate(node, ctx, -1.0f); }

}  // namespace engine::cuda
