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

}  // namespace engine::ops
