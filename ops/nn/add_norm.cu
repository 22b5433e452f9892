// CUDA kernel of add_norm (nn/add_norm.h; CPU: the add's and the norm's kernels in turn): one warp
// per row, kNormRowsPerBlock rows a block, as the norm's forward (nn/layernorm.cu); the row program
// add_norm_forward_row writes the row's sums and normalises them while they are in cache. a, b, s
// and y share one type (the fusion pass's condition), read and written in it, 16 bytes a thread at
// a time where the row and the parameters allow.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kBlockThreads = ops::kNormLanes * ops::kNormRowsPerBlock;

template <class T, class W, int P>
__global__ void __launch_bounds__(kBlockThreads)
    add_norm_kernel(FloatArray<T> a, FloatArray<T> b,              // (rows, c)
                    FloatArray<T> s,                               // (rows, c)
                    FloatArray<W> w, FloatArray<W> shift,          // (c); or null
                    FloatArray<T> y,                               // (rows, c)
                    FloatArray<void> mean, FloatArray<void> rstd,  // (rows)
                    int64_t rows, int64_t c, bool rms, double eps) {
  ops::WarpLanes lanes;
  const int64_t r = int64_t(blockIdx.x) * ops::kNormRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  ops::add_norm_forward_row<P>(lanes, a + r * c, b + r * c, s + r * c, c, rms, eps, w, shift, y + r * c, mean + r,
                               rstd + r);
}

}  // namespace

// inputs a, b, w [, shift]; outputs s, y, mean, rstd
void add_norm(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[0]);
  const int64_t rows = xs.rows(), c = xs.last();
  if (rows == 0 || c == 0) return;
  const bool shift = node.attrs.ints[1] == 1, rms = node.attrs.ints[0] == 1;
  const ValueId a = node.inputs[0], b = node.inputs[1], s = node.outputs[0], y = node.outputs[1];
  with_float_type(ctx, {a, b, s, y}, [&](auto rows_tag) {
    using T = typename decltype(rows_tag)::type;
    with_float_type(ctx, {node.inputs[2], node.inputs[shift ? 3 : 2]}, [&](auto params_tag) {
      using W = typename decltype(params_tag)::type;
      const auto launch = [&](auto kernel) {
        kernel<<<unsigned((rows + ops::kNormRowsPerBlock - 1) / ops::kNormRowsPerBlock), kBlockThreads, 0,
                 stream(ctx)>>>(float_array<T>(ctx, a), float_array<T>(ctx, b), float_array<T>(ctx, s),
                                float_array<W>(ctx, node.inputs[2]),
                                shift ? float_array<W>(ctx, node.inputs[3]) : FloatArray<W>{}, float_array<T>(ctx, y),
                                float_array<void>(ctx, node.outputs[2]), float_array<void>(ctx, node.outputs[3]), rows,
                                c, rms, node.attrs.floats[0]);
      };
      constexpr int P = kPack<T>;
      bool packed = P > 1 && c % P == 0 && pack_aligned(ctx.data(node.inputs[2])) &&
                    (!shift || pack_aligned(ctx.data(node.inputs[3])));
      for (ValueId id : {a, b, s, y}) packed = packed && pack_aligned(ctx.data(id));
      if (packed)
        launch(add_norm_kernel<T, W, P>);
      else
        launch(add_norm_kernel<T, W, 1>);
    });
  });
  check_launch("add_norm_kernel");
}

}  // namespace engine::cuda
