// CUDA kernels of reduce_sum / reduce_mean and their backward (reduce/sum.cpp).
//
// The CPU sums each row in order in double; here one thread sums one row in the same order, so the
// result is the CPU's, bit for bit, and does not depend on the launch shape. (One thread per row
// is slow for a few long rows; the op only serves small reductions, tests and metrics, today.)
#include "cuda_kernels.h"
#include "cuda_util.cuh"

namespace engine::cuda {

namespace {

__global__ void reduce_kernel(const float* x, float* y, int64_t rows, int64_t n,
                              double factor) {  // x (rows, n), y (rows,)
  for (int64_t r = thread_index(); r < rows; r += thread_stride()) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += x[r * n + i];
    y[r] = float(sum * factor);
  }
}

// dx (+)= dy[row] * factor, the product rounded once per row as on the CPU.
__global__ void reduce_backward_kernel(const float* dy, float* dx, int64_t rows, int64_t n, float factor,
                                       bool accumulate) {  // dy (rows,), dx (rows, n)
  for (int64_t i = thread_index(); i < rows * n; i += thread_stride()) {
    const float v = dy[i / n] * factor;
    dx[i] = accumulate ? dx[i] + v : v;
  }
}

}  // namespace

// attrs.floats[0]: the factor (1 for a sum, 1/N for a mean)
void reduce_sum(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  if (rows == 0) return;
  reduce_kernel<<<blocks_for(rows), kThreads, 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), rows,
                                                                n, node.attrs.floats[0]);
  check_launch("reduce_sum");
}

// inputs dy (...); output dx (..., N)
void reduce_backward(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.outputs[0]);
  const int64_t rows = s.rows(), n = s.last();
  if (rows * n == 0) return;
  reduce_backward_kernel<<<blocks_for(rows * n), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), rows, n, float(node.attrs.floats[0]),
      ctx.accumulates(node, 0));
  check_launch("reduce_backward");
}

}  // namespace engine::cuda
