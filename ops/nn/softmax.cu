// CUDA kernels of softmax and its backward (CPU: softmax_cpu, softmax_backward_cpu in
// nn/softmax.cpp), on f32, bf16 or f16 values read and written in their own types (fp32 and double
// arithmetic as before, each output rounded once: the bits of the executor's widening and rounding;
// T the rows' common type, void where they are mixed): one block of kLanes threads per row running the row programs
// (nn/row_programs.h): the max, then the exponentials' sum (in double, as the CPU), then the output.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kLanes = ops::kSoftmaxLanes;

template <class T>
__global__ void __launch_bounds__(kLanes)
    softmax_kernel(FloatArray<T> x, FloatArray<T> y, int64_t cols) {  // (rows, cols)
  ops::BlockLanes<kLanes> lanes;
  const int64_t r = blockIdx.x;
  ops::softmax_row(lanes, x + r * cols, cols, y + r * cols);
}

template <class T>
__global__ void __launch_bounds__(kLanes) softmax_backward_kernel(FloatArray<T> y, FloatArray<T> dy, FloatArray<T> dx,
                                                                  int64_t cols, bool accumulate) {  // (rows, cols)
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
  with_float_type(ctx, {node.inputs[0], node.outputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_kernel<T><<<unsigned(rows), kLanes, 0, stream(ctx)>>>(float_array<T>(ctx, node.inputs[0]),
                                                                  float_array<T>(ctx, node.outputs[0]), cols);
  });
  check_launch("softmax_kernel");
}

// inputs y, dy; output dx
void softmax_backward(const Node& node, const KernelContext& ctx) {
  const Shape& s = ctx.shape(node.inputs[0]);
  const int64_t rows = s.rows(), cols = s.last();
  if (rows == 0 || cols == 0) return;
  with_float_type(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<unsigned(rows), kLanes, 0, stream(ctx)>>>(
        float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.inputs[1]), float_array<T>(ctx, node.outputs[0]),
        cols, ctx.accumulates(node, 0));
  });
  check_launch("softmax_backward_kernel");
}

}  // namespace engine::cuda
