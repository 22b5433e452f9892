// transpose swaps the last two dimensions; reshape reinterprets the extents (same element count,
// row-major order kept). Both copy into a new value, so every value the planner places is dense.
//
//   transpose: x (..., M, N) -> (..., N, M);  its gradient is the transpose of dy
//   reshape:   x (shape) -> (new shape);       its gradient is dy reshaped back
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId transpose(Graph& g, ValueId x, const std::string& name);
ValueId reshape(Graph& g, ValueId x, Shape shape, const std::string& name);

extern const OpDef kTranspose, kReshape;

}  // namespace engine::ops
