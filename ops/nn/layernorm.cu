// CUDA kernels of layernorm and rmsnorm (CPU: norm_cpu, norm_backward_cpu in nn/layernorm.cpp), on
// f32, bf16 or f16 values read and written in their own types (fp32 arithmetic, each output rounded
// once: the bits of the executor's widening and rounding). Instantiated per type of the rows (x, y,
// dy, dx) and of the parameters (w, b), runtime-typed where a group's types are mixed; the
// statistics, partial sums and parameter gradients typed at run time. The per-row math is the row
// programs' (nn/row_programs.h), run by one warp per row (nn/row_launch.h).
//
// Forward: one warp per row, kNormRowsPerBlock rows a block. Backward: one block of
// kNormBackwardLanes threads per group of kNormGroupRows consecutive rows, which writes dx and its
// group's float sums of the scale and shift gradients into the workspace; then one thread per (column, warp) adds every
// kSumWarps-th group's sum in double, and the warps' sums are added in a fixed order and added to the gradients. No
// atomics: the same bits on every run.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kBlockThreads = ops::kNormLanes * ops::kNormRowsPerBlock;
constexpr int kSumWarps = 8;  // warps adding the groups' partial sums of 32 columns

// Blocks for `n` rows at kNormRowsPerBlock warps a block.
unsigned blocks_of(int64_t n) { return unsigned((n + ops::kNormRowsPerBlock - 1) / ops::kNormRowsPerBlock); }

bool is_rms(const Node& node) { return node.attrs.ints[0] == 1; }
bool has_shift(const Node& node) { return node.attrs.ints[1] == 1; }

template <class T, class W>
__global__ void __launch_bounds__(kBlockThreads) norm_forward_kernel(FloatArray<T> x,        // (rows, c)
                                                                     FloatArray<W> w,        // (c)
                                                                     FloatArray<W> b,        // (c) or null
                                                                     FloatArray<T> y,        // (rows, c)
                                                                     FloatArray<void> mean,  // (rows)
                                                                     FloatArray<void> rstd,  // (rows)
                                                                     int64_t rows, int64_t c, bool rms, double eps) {
  ops::WarpLanes lanes;
  const int64_t r = int64_t(blockIdx.x) * ops::kNormRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  ops::norm_forward_row(lanes, x + r * c, c, rms, eps, w, b, y + r * c, mean + r, rstd + r);
}

template <class T, class W>
__global__ void __launch_bounds__(ops::kNormBackwardLanes)
    norm_backward_kernel(FloatArray<T> dy,                              // (rows, c)
                         FloatArray<T> x,                               // (rows, c)
                         FloatArray<W> w,                               // (c)
                         FloatArray<void> mean, FloatArray<void> rstd,  // (rows)
                         FloatArray<T> dx,                              // (rows, c)
                         float* dw_groups,                              // (groups, c)
                         float* db_groups,                              // (groups, c) or null
                         int64_t rows, int64_t c, int64_t group_rows, bool rms, bool accumulate) {
  ops::BlockLanes<ops::kNormBackwardLanes> lanes;
  const int64_t g = blockIdx.x;
  const int64_t begin = g * group_rows, end = begin + group_rows < rows ? begin + group_rows : rows;
  ops::norm_backward_rows(lanes, dy, x, w, mean, rstd, c, rms, begin, end, dw_groups + g * c,
                          db_groups ? db_groups + g * c : nullptr, dx, accumulate);
}

// Block (32 columns) x (kSumWarps warps): warp k adds groups k, k + kSumWarps, ... of its lane's
// column in double; warp 0 adds the warps' sums in order and adds the total to the gradient.
__global__ void __launch_bounds__(32 * kSumWarps)
    norm_parameter_sums_kernel(const float* dw_groups, const float* db_groups,  // (groups, c)
                               FloatArray<void> dw, FloatArray<void> db,        // (c)
                               int64_t groups, int64_t c) {
  __shared__ double sums[2][kSumWarps][32];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t col = int64_t(blockIdx.x) * 32 + lane;
  double sw = 0.0, sb = 0.0;
  if (col < c)
    for (int64_t g = warp; g < groups; g += kSumWarps) {
      sw += dw_groups[g * c + col];
      if (db_groups) sb += db_groups[g * c + col];
    }
  sums[0][warp][lane] = sw;
  sums[1][warp][lane] = sb;
  __syncthreads();
  if (warp == 0 && col < c) {
    double tw = 0.0, tb = 0.0;
    for (int k = 0; k < kSumWarps; ++k) {
      tw += sums[0][k][lane];
      tb += sums[1][k][lane];
    }
    dw.store(col, dw.load(col) + float(tw));
    if (db) db.store(col, db.load(col) + float(tb));
  }
}

}  // namespace

// inputs x, w [, b]; outputs y, mean, rstd
void norm(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[0]);
  const int64_t rows = xs.rows(), c = xs.last();
  if (rows == 0 || c == 0) return;
  const bool shift = has_shift(node);
  with_float_type(ctx, {node.inputs[0], node.outputs[0]}, [&](auto rows_tag) {
    using T = typename decltype(rows_tag)::type;
    // The scale and, where there is one, the shift (an initializer_list made in a conditional
    // would not outlive its full-expression).
    with_float_type(ctx, {node.inputs[1], node.inputs[shift ? 2 : 1]}, [&](auto params_tag) {
      using W = typename decltype(params_tag)::type;
      norm_forward_kernel<T, W><<<blocks_of(rows), kBlockThreads, 0, stream(ctx)>>>(
          float_array<T>(ctx, node.inputs[0]), float_array<W>(ctx, node.inputs[1]),
          shift ? float_array<W>(ctx, node.inputs[2]) : FloatArray<W>{}, float_array<T>(ctx, node.outputs[0]),
          float_array<void>(ctx, node.outputs[1]), float_array<void>(ctx, node.outputs[2]), rows, c, is_rms(node),
          node.attrs.floats[0]);
    });
  });
  check_launch("norm_forward_kernel");
}

// inputs dy, x, w, mean, rstd; outputs dx, dw [, db] (the scale and shift gradients are added to)
void norm_backward(const Node& node, const KernelContext& ctx) {
  const Shape& xs = ctx.shape(node.inputs[1]);
  const int64_t rows = xs.rows(), c = xs.last();
  if (rows == 0 || c == 0) return;
  const bool shift = has_shift(node);
  // The groups' partial sums live in the workspace: fewer, longer groups if it is short.
  const int64_t row_bytes = c * int64_t(sizeof(float)) * (shift ? 2 : 1);
  const int64_t max_groups = int64_t(ctx.workspace_bytes) / row_bytes;
  if (max_groups < 1 || ctx.workspace == nullptr)
    throw InternalError("norm_backward: a workspace of " + std::to_string(row_bytes) + " bytes is needed");
  int64_t groups = (rows + ops::kNormGroupRows - 1) / ops::kNormGroupRows;
  if (groups > max_groups) groups = max_groups;
  const int64_t group_rows = (rows + groups - 1) / groups;
  groups = (rows + group_rows - 1) / group_rows;
  float* dw_groups = static_cast<float*>(ctx.workspace);
  float* db_groups = shift ? dw_groups + groups * c : nullptr;
  with_float_type(ctx, {node.inputs[0], node.inputs[1], node.outputs[0]}, [&](auto rows_tag) {
    using T = typename decltype(rows_tag)::type;
    with_float_type(ctx, {node.inputs[2]}, [&](auto params_tag) {
      using W = typename decltype(params_tag)::type;
      norm_backward_kernel<T, W><<<unsigned(groups), ops::kNormBackwardLanes, 0, stream(ctx)>>>(
          float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.inputs[1]), float_array<W>(ctx, node.inputs[2]),
          float_array<void>(ctx, node.inputs[3]), float_array<void>(ctx, node.inputs[4]),
          float_array<T>(ctx, node.outputs[0]), dw_groups, db_groups, rows, c, group_rows, is_rms(node),
          ctx.accumulates(node, 0));
    });
  });
  check_launch("norm_backward_kernel");
  norm_parameter_sums_kernel<<<unsigned((c + 31) / 32), 32 * kSumWarps, 0, stream(ctx)>>>(
      dw_groups, db_groups, float_array<void>(ctx, node.outputs[1]),
      shift ? float_array<void>(ctx, node.outputs[2]) : FloatArray<void>{}, groups, c);
  check_launch("norm_parameter_sums_kernel");
}

}  // namespace engine::cuda
