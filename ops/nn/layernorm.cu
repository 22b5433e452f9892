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
// added to the gradients. No atomics: the same bits on every run. Where the plan gave the node
// dx's column sums (fuse_norm_bias_gradients, nn/layernorm.h: a linear layer's bias gradient), they
// are a third set of group sums, summed the same way.
#include "cuda_kernels.h"
#include "cuda_util.cuh"
#include "nn/block_lanes.cuh"
#include "nn/layernorm.h"
#include "nn/row_launch.h"

namespace engine::cuda {

namespace {

constexpr int kBlockThreads = ops::kNormLanes * ops::kNormRowsPerBlock;
constexpr int kSumWarps = 8;    // warps adding the groups' partial sums of 32 columns
constexpr int kSumSlices = 16;  // slices of the groups whose sums are added in parallel
constexpr int kColumnSums = 3;  // the scale's, the shift's and dx's column sums

// Blocks for `n` rows at kNormRowsPerBlock warps a block.
unsigned blocks_of(int64_t n) { return unsigned((n + ops::kNormRowsPerBlock - 1) / ops::kNormRowsPerBlock); }

bool is_rms(const Node& node) { return node.attrs.ints[0] == 1; }
bool has_shift(const Node& node) { return node.attrs.ints[1] == 1; }

// The groups' partial sums of up to three column sums (the scale's, the shift's, dx's), each
// (groups, c), null where the node has no such output; and each one's slot in the slices' sums
// (the sums present, in that order).
struct GroupSums {
  float* sums[kColumnSums] = {};
  int slot[kColumnSums] = {};
};

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
                         GroupSums groups,                              // dw, db or null, dx's or null
                         int64_t rows, int64_t c, int64_t group_rows, bool rms, bool accumulate) {
  ops::BlockLanes<ops::kNormBackwardLanes> lanes;
  const int64_t g = blockIdx.x;
  const int64_t begin = g * group_rows, end = begin + group_rows < rows ? begin + group_rows : rows;
  const auto at = [&](float* sums) { return sums ? sums + g * c : nullptr; };
  ops::norm_backward_rows(lanes, dy, x, w, mean, rstd, c, rms, begin, end, at(groups.sums[0]), at(groups.sums[1]), dx,
                          base, accumulate, at(groups.sums[2]));
}

// One warp per group of rows, kNormRowsPerBlock groups a block; P the rows' pack, K packs a lane at
// most (w is read once a group, a pack at a time where it is of the rows' type); kShift and
// kDxSums, which running sums the lanes hold besides the scale's (row_programs.h).
template <class T, class W, int P, int K, bool kShift, bool kDxSums>
__global__ void __launch_bounds__(kBlockThreads, 2)  // two blocks an SM at least: 16 warps, 128 registers each
    norm_backward_registers_kernel(FloatArray<T> dy, FloatArray<T> x, FloatArray<W> w,  // (rows, c), (rows, c), (c)
                                   FloatArray<void> mean, FloatArray<void> rstd,        // (rows)
                                   FloatArray<T> dx, FloatArray<T> base,                // (rows, c) each
                                   GroupSums sums,                                      // dw, db or null, dx's or null
                                   int64_t rows, int64_t c, int64_t groups, int64_t group_rows, bool rms,
                                   bool accumulate) {
  ops::WarpLanes lanes;
  const int64_t g = int64_t(blockIdx.x) * ops::kNormRowsPerBlock + threadIdx.x / 32;
  if (g >= groups) return;
  const int64_t begin = g * group_rows, end = begin + group_rows < rows ? begin + group_rows : rows;
  const auto at = [&](float* group_sums) { return group_sums ? group_sums + g * c : nullptr; };
  ops::norm_backward_rows_in_registers<P, K, kShift, kDxSums>(lanes, dy, x, w, mean, rstd, c, rms, begin, end,
                                                              at(sums.sums[0]), at(sums.sums[1]), dx, base, accumulate,
                                                              at(sums.sums[2]));
}

// The groups' partial sums are added in kSumSlices slices of consecutive groups, each slice by a
// block of 32 columns x kSumWarps warps: warp k adds the slice's groups k, k + kSumWarps, ... of its
// lane's column in double, and warp 0 adds the warps' sums in order into the slice's sum. (One
// block per 32 columns, as before, left most of the card idle: a few dozen blocks, each thread
// adding hundreds of groups one load at a time.) Each of the column sums present the same way.
__global__ void __launch_bounds__(32 * kSumWarps) norm_slice_sums_kernel(GroupSums groups_sums,  // (groups, c) each
                                                                         double* slice_sums,  // (slots, kSumSlices, c)
                                                                         int64_t groups, int64_t c) {
  __shared__ double sums[kColumnSums][kSumWarps][32];
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t col = int64_t(blockIdx.x) * 32 + lane, slice = blockIdx.y;
  const int64_t per_slice = (groups + kSumSlices - 1) / kSumSlices;
  const int64_t first = slice * per_slice, last = first + per_slice < groups ? first + per_slice : groups;
  double partial[kColumnSums] = {};
  if (col < c) {
#pragma unroll 4
    for (int64_t g = first + warp; g < last; g += kSumWarps)
#pragma unroll
      for (int k = 0; k < kColumnSums; ++k)
        if (groups_sums.sums[k]) partial[k] += groups_sums.sums[k][g * c + col];
  }
#pragma unroll
  for (int k = 0; k < kColumnSums; ++k) sums[k][warp][lane] = partial[k];
  __syncthreads();
  if (warp == 0 && col < c) {
#pragma unroll
    for (int k = 0; k < kColumnSums; ++k) {
      if (!groups_sums.sums[k]) continue;
      double total = 0.0;
      for (int w = 0; w < kSumWarps; ++w) total += sums[k][w][lane];
      slice_sums[(groups_sums.slot[k] * kSumSlices + slice) * c + col] = total;
    }
  }
}

// The slices' sums added in slice order, and each total added to its gradient once in float.
struct ColumnTotals {
  FloatArray<void> out[kColumnSums];  // the scale's gradient, the shift's or null, dx's sums' or null
  int slot[kColumnSums] = {};         // GroupSums::slot
};
__global__ void norm_parameter_totals_kernel(const double* slice_sums, ColumnTotals totals, int64_t c) {
  for (int64_t col = thread_index(); col < c; col += thread_stride())
#pragma unroll
    for (int k = 0; k < kColumnSums; ++k) {
      if (!totals.out[k]) continue;
      double total = 0.0;
      for (int s = 0; s < kSumSlices; ++s) total += slice_sums[(totals.slot[k] * kSumSlices + s) * c + col];
      totals.out[k].store(col, totals.out[k].load(col) + float(total));
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

// inputs dy, x, w, mean, rstd [, base]; outputs dx, dw [, db] [, dx's column sums] (the scale and
// shift gradients, and the column sums, are added to). With base (norm_backward_onto,
// nn/layernorm.h), dx = base + the input gradient.
void norm_backward(const Node& node, const KernelContext& ctx) {
  // A frozen scale (LoRA's base, which runs on the CPU only for now) would have no gradient output.
  ENGINE_CHECK(node.outputs.size() > 1, node.name + ": the CUDA norm backward needs the scale's gradient");
  const Shape& xs = ctx.shape(node.inputs[1]);
  const int64_t rows = xs.rows(), c = xs.last();
  if (rows == 0 || c == 0) return;
  const bool shift = has_shift(node), dx_sums = ops::sums_norm_output(node);
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
  // The slices' double sums take the workspace's first bytes: two slots at least, as before there
  // were dx's sums, so that a node without them is cut into the same groups (the same bits) where
  // the workspace does not bind; where it does (over about 58K rows of 768 columns in 64 MiB), the
  // node with the bias sums has fewer, longer groups, and its scale and shift gradients other bits.
  const int64_t arrays = 1 + (shift ? 1 : 0) + (dx_sums ? 1 : 0), slots = arrays < 2 ? 2 : arrays;
  const int64_t row_bytes = c * int64_t(sizeof(float)) * arrays;
  const int64_t slice_bytes = slots * kSumSlices * c * int64_t(sizeof(double));
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
  GroupSums sums;
  float* next = reinterpret_cast<float*>(slice_sums + slots * kSumSlices * c);
  for (int k = 0, slot = 0; k < kColumnSums; ++k)
    if (k == 0 || (k == 1 && shift) || (k == 2 && dx_sums)) {
      sums.sums[k] = next;
      sums.slot[k] = slot++;
      next += groups * c;
    }
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
                sums, rows, c, groups, group_rows, is_rms(node), accumulate);
          };
          // Packs a lane and which running sums it holds fix its registers. Each instantiation is
          // code in every binary that links the kernels (and in the GPU machine's bundle), so only
          // those a plan runs: the scale's and shift's sums at 2, 4 or 8 packs a lane (an RMS
          // norm's at 2 or 4 holds the shift's unused registers, which fit; at 8, where they
          // spilled, it holds none); with dx's column sums (fuse_norm_bias_gradients: a layernorm
          // with shift, at most kNormMaxPacksWithColumnSums packs a lane) at 2, 3 (GPT-2's 768
          // bf16 columns) or 4.
          if (dx_sums) {
            if (!shift || packs_per_lane > ops::kNormMaxPacksWithColumnSums)
              throw InternalError(node.name + ": dx's column sums on a norm without shift or wider than " +
                                  std::to_string(ops::kNormMaxPacksWithColumnSums) + " packs a lane");
            if (packs_per_lane <= 2)
              launch(norm_backward_registers_kernel<T, W, P, 2, true, true>);
            else if (packs_per_lane <= 3)
              launch(norm_backward_registers_kernel<T, W, P, 3, true, true>);
            else
              launch(norm_backward_registers_kernel<T, W, P, 4, true, true>);
          } else if (packs_per_lane <= 2) {
            launch(norm_backward_registers_kernel<T, W, P, 2, true, false>);
          } else if (packs_per_lane <= 4) {
            launch(norm_backward_registers_kernel<T, W, P, 4, true, false>);
          } else if (shift) {
            launch(norm_backward_registers_kernel<T, W, P, kMaxPacks, true, false>);
          } else {
            launch(norm_backward_registers_kernel<T, W, P, kMaxPacks, false, false>);
          }
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
            sums, rows, c, group_rows, is_rms(node), accumulate);
      });
    });
    check_launch("norm_backward_kernel");
  }
  norm_slice_sums_kernel<<<dim3(unsigned((c + 31) / 32), kSumSlices), 32 * kSumWarps, 0, stream(ctx)>>>(
      sums, slice_sums, groups, c);
  check_launch("norm_slice_sums_kernel");
  ColumnTotals totals;
  for (int k = 0; k < kColumnSums; ++k) totals.slot[k] = sums.slot[k];
  totals.out[0] = float_array<void>(ctx, node.outputs[1]);
  if (shift) totals.out[1] = float_array<void>(ctx, node.outputs[2]);
  if (dx_sums) totals.out[2] = float_array<void>(ctx, node.outputs.back());
  norm_parameter_totals_kernel<<<blocks_for(c, 128), 128, 0, stream(ctx)>>>(slice_sums, totals, c);
  check_launch("norm_parameter_totals_kernel");
}

}  // namespace engine::cuda
