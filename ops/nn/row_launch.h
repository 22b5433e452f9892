// How the CUDA row kernels launch the row programs (nn/row_programs.h): the lanes per row and the
// rows per partial sum. The reduction trees, and so the bits, follow from these numbers; the CPU
// test of the programs (tests/ops/row_program_test.cpp) runs SerialLanes with the same ones.
//
//   layernorm / rmsnorm   forward: one warp per row (WarpLanes, nn/block_lanes.cuh), kNormRowsPerBlock
//                         rows side by side, in packs of 16 bytes where the row allows; backward,
//                         where a warp's registers hold the group's running sums of the scale and
//                         shift gradients (norm_backward_rows_in_registers): one warp per group of
//                         kNormRegisterGroupRows rows, in packs; else one block of kNormBackwardLanes
//                         threads per group of kNormGroupRows rows (BlockLanes, the running sums in
//                         the workspace)
//   softmax               one block of kSoftmaxLanes threads per row (BlockLanes)
//   cross-entropy         one block of kCrossEntropyLanes threads per row (BlockLanes), in packs of
//                         16 bytes where the vocabulary allows
#pragma once

#include <cstdint>

namespace engine::ops {

inline constexpr int kNormLanes = 32;
inline constexpr int kNormRowsPerBlock = 8;
inline constexpr int kNormBackwardLanes = 256;
inline constexpr int64_t kNormGroupRows = 32;  // at least; more where the workspace is short (as the CPU's blocks)
inline constexpr int64_t kNormRegisterGroupRows = 8;
// The widest row whose backward also sums dx's columns (fuse_norm_bias_gradients, nn/layernorm.h):
// 4 packs of 16 bytes a lane, where a lane's three sets of running sums fit its registers (ptxas,
// sm_90, bf16 rows: 122 registers at 4 packs; at 8, 128 and 620 bytes of spills). 1024 bf16 columns.
inline constexpr int64_t kNormMaxPacksWithColumnSums = 4;
inline constexpr int kSoftmaxLanes = 256;
inline constexpr int kCrossEntropyLanes = 512;

}  // namespace engine::ops
