// CUDA kernel of dropout and dropout_backward (nn/dropout.cpp apply_mask): out (+)= in * keep / (1 - p)
// on f32 values, drawing the CPU's Philox words (nn/dropout_math.h), so the masks are the same bits.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/dropout_math.h"

namespace engine::cuda {

namespace {

// One thread per block of 4 elements (one Philox call), grid-stride.
__global__ void dropout_kernel(const float* in, float* out, int64_t n, ops::DropoutMask mask, bool accumulate) {
  const int64_t blocks = (n + 3) / 4;
  for (int64_t block = thread_index(); block < blocks; block += thread_stride()) {
    const PhiloxWords words = mask.block(block);
    for (int64_t j = 0; j < 4 && block * 4 + j < n; ++j) {
      const int64_t i = block * 4 + j;
      const float v = mask.apply(words.word[j], in[i]);
      out[i] = accumulate ? out[i] + v : v;
    }
  }
}

}  // namespace

// inputs[0]: x (forward) or dy (backward); attrs: salt (ints[0]), p (floats[0])
void dropout_mask(const Node& node, const KernelContext& ctx) {
  if (!ctx.training) return copy(node, ctx);  // evaluation: the identity, as on the CPU
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  const ops::DropoutMask mask =
      ops::DropoutMask::make(node.attrs.floats[0], node.attrs.ints[0], ctx.seed, ctx.step, ctx.micro_step);
  dropout_kernel<<<blocks_for((n + 3) / 4), kThreads, 0, stream(ctx)>>>(
      ctx.f32(node.inputs[0]), ctx.f32(node.outputs[0]), n, mask, ctx.accumulates(node, 0));
  check_launch("dropout");
}

}  // namespace engine::cuda
