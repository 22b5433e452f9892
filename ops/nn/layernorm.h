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

}  // namespace engine::ops
