// CUDA kernel of add (elementwise/add.cpp): y = a + b, f32 (the executor widens 16-bit values).
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "elementwise/add_math.h"

namespace engine::cuda {

namespace {

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {  // (n,) each
  for (int64_t i = thread_index(); i < n; i += thread_stride()) y[i] = ops::add_values(a[i], b[i]);
}

}  // namespace

void add(const Node& node, const KernelContext& ctx) {
  const int64_t n = ctx.shape(node.inputs[0]).numel();
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, stream(ctx)>>>(ctx.f32(node.inputs[0]), ctx.f32(node.inputs[1]),
                                                          ctx.f32(node.outputs[0]), n);
  check_launch("add");
}

}  // namespace engine::cuda
