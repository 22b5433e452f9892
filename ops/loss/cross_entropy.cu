// CUDA kernel of softmax cross-entropy (CPU: cross_entropy_cpu in loss/cross_entropy.cpp), on f32,
// bf16 or f16 logits read and overwritten in their own type (fp32 arithmetic, each gradient rounded
// once: the bits of the executor's widening and rounding); the losses in their own type. One block
// of kLanes threads per row runs the row program (nn/row_programs.h) that writes the row's loss and
// overwrites its logits with scale * (softmax - onehot), scale = the op's scale times the context's
// loss scale. Two reads of the row (an online max and sum of exponentials per thread, then the
// gradient) and one write; no atomics.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"

namespace engine::cuda {

namespace {

constexpr int kLanes = 512;

template <class T>
__global__ void __launch_bounds__(kLanes) cross_entropy_kernel(FloatArray<T> logits,     // (rows, vocab), overwritten
                                                               const int32_t* targets,   // (rows)
                                                               FloatArray<void> losses,  // (rows)
                                                               int64_t vocab, float scale) {
  ops::BlockLanes<kLanes> lanes;
  const int64_t r = blockIdx.x;
  const float loss = ops::cross_entropy_row(lanes, logits + r * vocab, vocab, targets[r], scale);
  if (threadIdx.x == 0) losses.store(r, loss);
}

}  // namespace

// inputs logits (overwritten with their gradient), targets (i32); output losses
void cross_entropy(const Node& node, const KernelContext& ctx) {
  const Shape& ls = ctx.shape(node.inputs[0]);
  const int64_t rows = ls.rows(), vocab = ls.last();
  if (rows == 0) return;
  const float scale = float(node.attrs.floats[0]) * ctx.loss_scale;
  with_float_type(ctx, {node.inputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cross_entropy_kernel<T>
        <<<unsigned(rows), kLanes, 0, stream(ctx)>>>(float_array<T>(ctx, node.inputs[0]), ctx.i32(node.inputs[1]),
                                                     float_array<void>(ctx, node.outputs[0]), vocab, scale);
  });
  check_launch("cross_entropy_kernel");
}

}  // namespace engine::cuda
