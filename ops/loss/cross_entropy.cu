// CUDA kernel of softmax cross-entropy (CPU: cross_entropy_cpu in loss/cross_entropy.cpp), on f32,
// bf16 or f16 logits read and overwritten in their own type (fp32 arithmetic, each gradient rounded
// once: the bits of the executor's widening and rounding); the losses in their own type. One block
// of kLanes threads per row runs the row program (nn/row_programs.h) that writes the row's loss and
// overwrites its logits with scale * (softmax - onehot), scale = the op's scale times the step's
// loss scale (read from the step's scalars in device memory). Two reads of the row (an online max
// and sum of exponentials per thread, then the gradient) and one write, 16 bytes a thread at a time
// where the rows allow (vocab a multiple of the pack, the logits 16-byte aligned); no atomics.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kLanes = ops::kCrossEntropyLanes;

template <class T, int P>
__global__ void __launch_bounds__(kLanes) cross_entropy_kernel(FloatArray<T> logits,     // (rows, vocab), overwritten
                                                               const int32_t* targets,   // (rows)
                                                               FloatArray<void> losses,  // (rows)
                                                               int64_t vocab, float op_scale, const StepScalars* step) {
  ops::BlockLanes<kLanes> lanes;
  const int64_t r = blockIdx.x;
  const float scale = op_scale * step->loss_scale;
  const float loss = ops::cross_entropy_row<P>(lanes, logits + r * vocab, vocab, targets[r], scale);
  if (threadIdx.x == 0) losses.store(r, loss);
}

}  // namespace

// inputs logits (overwritten with their gradient), targets (i32); output losses
void cross_entropy(const Node& node, const KernelContext& ctx) {
  const Shape& ls = ctx.shape(node.inputs[0]);
  const int64_t rows = ls.rows(), vocab = ls.last();
  if (rows == 0) return;
  // The loss scale comes from the step's scalars in device memory.
  if (!ctx.step_scalars) throw InternalError("cross_entropy on CUDA: the context has no step scalars");
  with_float_type(ctx, {node.inputs[0]}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int P = kPack<T>;
    const auto launch = [&](auto kernel) {
      kernel<<<unsigned(rows), kLanes, 0, stream(ctx)>>>(float_array<T>(ctx, node.inputs[0]), ctx.i32(node.inputs[1]),
                                                         float_array<void>(ctx, node.outputs[0]), vocab,
                                                         float(node.attrs.floats[0]), ctx.step_scalars);
    };
    if (P > 1 && vocab % P == 0 && pack_aligned(ctx.data(node.inputs[0])))
      launch(cross_entropy_kernel<T, P>);
    else
      launch(cross_entropy_kernel<T, 1>);
  });
  check_launch("cross_entropy_kernel");
}

}  // namespace engine::cuda
