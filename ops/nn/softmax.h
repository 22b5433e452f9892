// softmax over the last dimension (max-subtracted, sums in double).
//
//   x (..., N) -> y (..., N);  backward (softmax_backward): dx = y * (dy - sum(dy * y))
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId softmax(Graph& g, ValueId x, const std::string& name);

extern const OpDef kSoftmax, kSoftmaxBackward;

}  // namespace engine::ops
