// reduce_sum and reduce_mean over the last dimension (accumulated in double).
//
//   x (..., N) -> (...);  the gradient broadcasts dy back over N (divided by N for the mean)
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId reduce_sum(Graph& g, ValueId x, const std::string& name);
ValueId reduce_mean(Graph& g, ValueId x, const std::string& name);

extern const OpDef kReduceSum, kReduceBackward;

}  // namespace engine::ops
