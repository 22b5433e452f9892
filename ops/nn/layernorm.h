// layernorm and rmsnorm over the last dimension, with learned scale (and shift for layernorm).
//
//   layernorm: x (..., C)  w (C)  b (C) or none  ->  y = (x - mean) * rstd * w + b
//   rmsnorm:   x (..., C)  w (C)         ->  y = x * rstd * w,  rstd = 1 / sqrt(mean(x^2) + eps)
//
// Statistics are computed in double per row and saved (mean, rstd: one float per row) for the
// backward, which produces dx and accumulates dw (and db).
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId layernorm(Graph& g, ValueId x, ValueId w, ValueId b, double eps, const std::string& name);
ValueId rmsnorm(Graph& g, ValueId x, ValueId w, double eps, const std::string& name);

extern const OpDef kLayerNorm, kLayerNormBackward, kRmsNorm, kRmsNormBackward;

// norm_backward_onto: either norm's backward with a sixth input, base: dx = base + the input
// gradient. A residual stream's value feeds both a norm and an addition, so autodiff copies the
// addition's gradient (an accumulate node) and the norm's backward adds onto the copy; this op
// reads the gradient where it lies instead, one pass over the rows fewer and the same bits (the
// copy is exact, the sum rounded once either way). fuse_gradient_copies puts it in a GPU plan (after
// autodiff and recompute) and returns how many copies it removed; the CPU kernel copies and adds.
extern const OpDef kNormBackwardOnto;
int fuse_gradient_copies(Graph& g);

// A norm backward that also sums its dx's columns: the bias gradient of the linear layer whose
// output gradient dx is. A residual block's projection (GPT-2's attention and MLP projections) adds
// its output to the residual stream, so its output gradient is the residual stream's gradient,
// which the next norm's backward writes; the projection's weight-gradient product summed it again
// for the bias (cuBLASLt's BGRADB epilogue, a separate pass over dy: 0.04-0.11 ms a product on an
// H100). fuse_norm_bias_gradients (GPU plans, after fuse_gradient_copies) finds each
//   norm backward (any of the three) -> dx;  ...;  linear_backward_weight(dx, x) -> dW, db
// where the norm is a layernorm with shift (GPT-2's; Llama's projections have no bias), no node
// between writes dx or db and the row is no wider than the kernel's registers hold the extra sums
// for (kNormMaxPacksWithColumnSums, nn/row_launch.h: up to 1024 bf16 columns), moves db to the
// norm backward as its last output and marks
// it (attrs.ints[2] = 1, sums_norm_output); returns how many it moved. The sums are of dx as stored,
// in the scale gradient's order (float within a group of rows, the groups in double); the CPU
// kernel runs the backward, then the linear backward's column sums of the stored dx.
int fuse_norm_bias_gradients(Graph& g);
inline bool sums_norm_output(const Node& node) { return node.attrs.ints.size() > 2 && node.attrs.ints[2] == 1; }

}  // namespace engine::ops
