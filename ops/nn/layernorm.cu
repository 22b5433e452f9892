// CUDA kernels of layernorm and rmsnorm (CPU: norm_cpu, norm_backward_cpu in nn/layernorm.cpp), on
// f32, bf16 or f16 values read and written in their own types (fp32 arithmetic, each output rounded
// once: the bits of the executor's widening and rounding). Instantiated per type of the rows (x, y,
// dy, dx) and of the parameters (w, b), runtime-typed where a group's types are mixed; the
// statistics, partial sums and parameter gradients typed at run time. The per-row math is the row
// programs' (nn/row_programs.h), with launches as nn/row_launch.h says.
//
// Forward: one warp per row, kNormRowsPerBlock rows a block, 16 bytes a thread at a time where the
// row and its parameters allow. Backward, where dy, x and dx share a type and a warp's
// registers hold a row's columns (c <= 8 packs a lane): one warp per group of
// kNormRegisterGroupRows rows, the group's running sums of the scale and shift gradients in the
// lanes' registers; otherwise one block of kNormBackwardLanes threads per group of kNormGroupRows
// rows, the running sums in the workspace. Either writes dx and its group's float sums of the
// parameter gradients into the workspace; then the groups' sums are added in double, in kSumSlices
// slices of consecutive groups (within a slice, warp k adds every kSumWarps-th group from the
// k-th, and the warps' sums are added in order), the slices' sums in slice order, and the total is
// added to the gradients. No atomics: the same bits on every run.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kBlockThreads = ops::kNormLanes * ops::kNormRowsPerBlock;
constexpr int kSumWarps = 8;    // warps adding the groups' partial sums of 32 columns
constexpr int kSumSlices = 16;  // slices of the groups whose sums are added in parallel

// Blocks for `n` rows at kNormRowsPerBlock warps a block.
unsigned blocks_of(int64_t n) { return unsigned((n + ops::kNormRowsPerBlock - 1) / ops::kNormRowsPerBlock); }

bool is_rms(const Node& node) { return node.attrs.ints[0] == 1; }
bool has_shift(const Node& node) { return node.attrs.ints[1] == 1; }

template <class T, class W, int P>
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
  ops::norm_forward_row<P>(lanes, x + r * c, c, rms, eps, w, b, y + r * c, mean + r, rstd + r);
}

template <class T, class W>
__global__ void __launch_bounds__(ops::kNormBackwardLanes)
    norm_backward_kernel(FloatArray<T> dy,                              // (rows, c)
                         FloatArray<T> x,                               // (rows, c)
                         FloatArray<W> w,                               // (c)
                         FloatArray<void> mean, FloatArray<void> rstd,  // (rows)
                         FloatArray<T> dx,                              // (rows, c)
                         FloatArray<T> base,                            // (rows, c): dx, or what dx starts from
                         float* dw_groups,                              // (groups, c)
                         float* db_groups,                              // (groups, c) or null
                         int64_t rows, int64_t c, int64_t group_rows, bool rms, bool accumulate) {
  ops::BlockLanes<ops::kNormBackwardLanes> lanes;
  const int64_t g = blockIdx.x;
  const int64_t begin = g * group_rows, end = begin + group_rows < rows ? begin + group_rows : rows;
  ops::norm_backward_rows(lanes, dy, x, w, mean, rstd, c, rms, begin, end, dw_groups + g * c,
                          db_groups ? db_groups + g * c : nullptr, dx, base, accumulate);
}

// One warp per group of rows, kNormRowsPerBlock groups a block; P the rows' pack, K packs a lane at
// most (w is read once a group, a pack at a time where it is of the rows' type).
template <class T, class W, int P, int K>
__global__ void __launch_bounds__(kBlockThreads, 2)  // two blocks an SM at least: 16 warps, 128 registers each
    norm_backward_registers_kernel(FloatArray<T> dy, FloatArray<T> x, FloatArray<W> w,  // (rows, c), (rows, c), (c)
                                   FloatArray<void> mean, FloatArray<void> rstd,        // (rows)
                                   FloatArray<T> dx, FloatArray<T> base,                // (rows, c) each
                                   float* dw_groups, float* db_groups,                  // (groups, c); db or null
                                   int64_t rows, int64_t c, int64_t groups, int64_t group_rows, bool rms,
                                   bool accumulate) {
  ops::WarpLanes lanes;
  const int64_t g = int64_t(blockIdx.x) * ops::kNormRowsPerBlock + threadIdx.x / 32;
  if (g >= groups) return;
  const int64_t begin = g * group_rows, end = begin + group_rows < rows ? begin + group_rows : rows;
  ops::norm_backward_rows_in_registers<P, K>(lanes, dy, x, w, mean, rstd, c, rms, begin, end, dw_groups + g * c,
                                             db_groups ? db_groups + g * c : nullptr, dx, base, accumulate);
}

// The groups' partial sums are added in kSumSlices slices of consecutive groups, each slice by a
// block of 32 columns x kSumWarps warps: warp k adds the slice's groups k, k + kSumWarps, ... of its
// lane's column in double, and warp 0 adds the warps' sums in order into the slice's sum. (One
// block per 32 columns, as before, left most of the card idle: a few dozen blocks, each thread
// adding hundreds of groups one load at a time.)
__global__ void __launch_bounds__(32 * kSumWarps)
    norm_slice_sums_kernel(const float* dw_groups, const float* db_groups,  // (groups, c); db or null
                           double* slice_sums,                              // (2, kSumSlices, c)
                           int64_t groups, int64_t c) {
  __shared__ double sums[2][kSumWarps][32];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t col = int64_t(blockIdx.x) * 32 + lane, slice = blockIdx.y;
  const int64_t per_slice = (groups + kSumSlices - 1) / kSumSlices;
  const int64_t first = slice * per_slice, last = first + per_slice < groups ? first + per_slice : groups;
  double sw = 0.0, sb = 0.0;
  if (col < c) {
#pragma unroll 4
    for (int64_t g = first + warp; g < last; g += kSumWarps) {
      sw += dw_groups[g * c + col];
      if (db_groups) sb += db_groups[g * c + col];
    }
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
    slice_sums[slice * c + col] = tw;
    slice_sums[(kSumSlices + slice) * c + col] = tb;
  }
}

// The slices' sums added in slice order, and the total added to the gradients once in float.
__global__ void norm_parameter_totals_kernel(const double* slice_sums, FloatArray<void> dw, FloatArray<void> db,
                                             int64_t c) {
  for (int64_t col = thread_index(); col < c; col += thread_stride()) {
    double tw = 0.0, tb = 0.0;
    for (int s = 0; s < kSumSlices; ++s) {
      tw += slice_sums[s * c + col];
      tb += slice_sums[(kSumSlices + s) * c + col];
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
      const auto launch = [&](auto kernel) {
        kernel<<<blocks_of(rows), kBlockThreads, 0, stream(ctx)>>>(
            float_array<T>(ctx, node.inputs[0]), float_array<W>(ctx, node.inputs[1]),
            shift ? float_array<W>(ctx, node.inputs[2]) : FloatArray<W>{}, float_array<T>(ctx, node.outputs[0]),
            float_array<void>(ctx, node.outputs[1]), float_array<void>(ctx, node.outputs[2]), rows, c, is_rms(node),
            node.attrs.floats[0]);
      };
      constexpr int P = kPack<T>;
      const bool packed = P > 1 && c % P == 0 && pack_aligned(ctx.data(node.inputs[0])) &&
                          pack_aligned(ctx.data(node.outputs[0])) && pack_aligned(ctx.data(node.inputs[1])) &&
                          (!shift || pack_aligned(ctx.data(node.inputs[2])));
      if (packed)
        launch(norm_forward_kernel<T, W, P>);
      else
        launch(norm_forward_kernel<T, W, 1>);
    });
  });
  check_launch("norm_forward_kernel");
}

// inputs dy, x, w, mean, rstd [, base]; outputs dx, dw [, db] (the scale and shift gradients are
// added to). With base (norm_backward_onto, nn/layernorm.h), dx = base + the input gradient.
void norm_backward(const Node& node, const KernelContext& ctx) {
  // A frozen scale (LoRA's base, which runs on the CPU only for now) would have no gradient output.
  ENGINE_CHECK(node.outputs.size() > 1, node.name + ": the CUDA norm backward needs the scale's gradient");
  const Shape& xs = ctx.shape(node.inputs[1]);
  const int64_t rows = xs.rows(), c = xs.last();
  if (rows == 0 || c == 0) return;
  const bool shift = has_shift(node);
  // Packed, with the running sums in registers, where dy, x and dx share a type, their rows are
  // packs of 16 bytes and a lane's share of a row is at most kMaxPacks packs.
  constexpr int64_t kMaxPacks = 8;
  const DType type = ctx.dtype(node.inputs[1]);
  const int64_t pack = 16 / int64_t(dtype_size(type));
  bool in_registers = c % pack == 0 && c <= kMaxPacks * 32 * pack && pack_aligned(ctx.data(node.inputs[2]));
  const ValueId base = node.inputs.size() > 5 ? node.inputs[5] : node.outputs[0];
  const bool accumulate = base != node.outputs[0] || ctx.accumulates(node, 0);
  for (ValueId id : {node.inputs[0], node.inputs[1], node.outputs[0], base})
    in_registers = in_registers && ctx.dtype(id) == type && pack_aligned(ctx.data(id));
  // The groups' partial sums live in the workspace: fewer, longer groups if it is short.
  // The slices' double sums take the workspace's first bytes.
  const int64_t row_bytes = c * int64_t(sizeof(float)) * (shift ? 2 : 1);
  const int64_t slice_bytes = 2 * kSumSlices * c * int64_t(sizeof(double));
  const int64_t max_groups = (int64_t(ctx.workspace_bytes) - slice_bytes) / row_bytes;
  if (max_groups < 1 || ctx.workspace == nullptr)
    throw InternalError("norm_backward: a workspace of " + std::to_string(slice_bytes + row_bytes) +
                        " bytes is needed");
  const int64_t wanted_rows = in_registers ? ops::kNormRegisterGroupRows : ops::kNormGroupRows;
  int64_t groups = (rows + wanted_rows - 1) / wanted_rows;
  if (groups > max_groups) groups = max_groups;
  const int64_t group_rows = (rows + groups - 1) / groups;
  groups = (rows + group_rows - 1) / group_rows;
  auto* slice_sums = static_cast<double*>(ctx.workspace);
  float* dw_groups = reinterpret_cast<float*>(slice_sums + 2 * kSumSlices * c);
  float* db_groups = shift ? dw_groups + groups * c : nullptr;
  if (in_registers) {
    with_float_type(ctx, {node.inputs[1]}, [&](auto rows_tag) {
      using T = typename decltype(rows_tag)::type;
      with_float_type(ctx, {node.inputs[2]}, [&](auto params_tag) {
        using W = typename decltype(params_tag)::type;
        if constexpr (!std::is_void_v<T>) {
          constexpr int P = kPack<T>;
          const int64_t packs_per_lane = (c / P + 31) / 32;
          const auto launch = [&](auto kernel) {
            kernel<<<blocks_of(groups), kBlockThreads, 0, stream(ctx)>>>(
                float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.inputs[1]),
                float_array<W>(ctx, node.inputs[2]), float_array<void>(ctx, node.inputs[3]),
                float_array<void>(ctx, node.inputs[4]), float_array<T>(ctx, node.outputs[0]), float_array<T>(ctx, base),
                dw_groups, db_groups, rows, c, groups, group_rows, is_rms(node), accumulate);
          };
          if (packs_per_lane <= 2)
            launch(norm_backward_registers_kernel<T, W, P, 2>);
          else if (packs_per_lane <= 4)
            launch(norm_backward_registers_kernel<T, W, P, 4>);
          else
            launch(norm_backward_registers_kernel<T, W, P, kMaxPacks>);
        }
      });
    });
    check_launch("norm_backward_registers_kernel");
  } else {
    with_float_type(ctx, {node.inputs[0], node.inputs[1], node.outputs[0], base}, [&](auto rows_tag) {
      using T = typename decltype(rows_tag)::type;
      with_float_type(ctx, {node.inputs[2]}, [&](auto params_tag) {
        using W = typename decltype(params_tag)::type;
        norm_backward_kernel<T, W><<<unsigned(groups), ops::kNormBackwardLanes, 0, stream(ctx)>>>(
            float_array<T>(ctx, node.inputs[0]), float_array<T>(ctx, node.inputs[1]),
            float_array<W>(ctx, node.inputs[2]), float_array<void>(ctx, node.inputs[3]),
            float_array<void>(ctx, node.inputs[4]), float_array<T>(ctx, node.outputs[0]), float_array<T>(ctx, base),
            dw_groups, db_groups, rows, c, group_rows, is_rms(node), accumulate);
      });
    });
    check_launch("norm_backward_kernel");
  }
  norm_slice_sums_kernel<<<dim3(unsigned((c + 31) / 32), kSumSlices), 32 * kSumWarps, 0, stream(ctx)>>>(
      dw_groups, db_groups, slice_sums, groups, c);
  check_launch("norm_slice_sums_kernel");
  norm_parameter_totals_kernel<<<blocks_for(c, 128), 128, 0, stream(ctx)>>>(
      slice_sums, float_array<void>(ctx, node.outputs[1]),
      shift ? float_array<void>(ctx, node.outputs[2]) : FloatArray<void>{}, c);
  check_launch("norm_parameter_totals_kernel");
}

}  // namespace engine::cuda
