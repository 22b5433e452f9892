// CUDA kernels of add_columns and take_columns (shape/columns.cpp), f32, one thread per element.
#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

__global__ void add_columns_kernel(const float* y, const float* d, float* out, int64_t n, int64_t columns,
                                   int64_t offset, int64_t width, float scale) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const int64_t r = i / columns, j = i % columns - offset;
    out[i] = y[i] + (j >= 0 && j < width ? scale * d[r * width + j] : 0.0f);
  }
}

__global__ void take_columns_kernel(const float* x, float* out, int64_t n, int64_t columns, int64_t offset,
                                    int64_t width, float scale, bool accumulate) {
  for (int64_t i = thread_index(); i < n; i += thread_stride()) {
    const float v = scale * x[(i / width) * columns + offset + i % width];
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

void add_columns(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  add_columns_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]), ctx.f32(node.outputs[0]), n, ctx.shape(node.inputs[0]).last(),
      node.attrs.ints[0], node.attrs.ints[1], float(node.attrs.floats[0]));
  check_launch("add_columns");
}

void take_columns(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.outputs[0]).numel();
  if (n == 0) return;
  take_columns_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), n, ctx.shape(node.inputs[0]).last(), node.attrs.ints[0],
      node.attrs.ints[1], float(node.attrs.floats[0]), ctx.accumulates(node, 0));
  check_launch("take_columns");
}

}  // namespace engine::cuda
