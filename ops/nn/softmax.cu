// CUDA kernels of softmax and its backward (CPU: softmax_cpu, softmax_backward_cpu in
// nn/softmax.cpp), on f32 values: one block of kLanes threads per row running the row programs
// (nn/row_programs.h): the max, then the exponentials' sum (in double, as the CPU), then the output.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"

namespace engine::cuda {

namespace {

constexpr int kLanes = 256;

__global__ void __launch_bounds__(kLanes) softmax_kernel(const float* x, float* y, int64_t cols) {  // (rows, cols)
  ops::BlockLanes<kLanes> lanes;
  const int64_t r = blockIdx.x;
  ops::softmax_row(lanes, x + r * cols, cols, y + r * cols);
}

__global__ void __launch_bounds__(kLanes)
    softmax_backward_kernel(const float* y, const float* dy, float* dx, int64_t cols, bool accumulate) {  // (rows, cols)
  ops::BlockLanes<kLanes> lanes;
  const int64_t r = blockIdx.x;
  ops::softmax_backward_row(lanes, y + r * cols, dy + r * cols, cols, dx + r * cols, accumulate);
}

}  // namespace

// input x; output y
void softmax(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), cols = s.last();
  if (rows == 0 || cols == 0) return;
  softmax_kernel<<<unsigned(rows), kLanes, 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), cols);
  check_launch("softmax_kernel");
}

// inputs y, dy; output dx
void softmax_backward(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), cols = s.last();
  if (rows == 0 || cols == 0) return;
  softmax_backward_kernel<<<unsigned(rows), kLanes, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]), ctx.f32(node.outputs[0]), cols, ctx.accumulates(node, 0));
  check_launch("softmax_backward_kernel");
}

}  // namespace engine::cuda
