// linear: y = x W^T + b, the fully connected layer (PyTorch's nn.Linear layout: W is (out, in)).
//
//   x (..., K)  W (M, K)  b (M) or none  ->  y (..., M)
//
// Backward: dx = dy W (linear_backward_input); dW += dy^T x and db += sum over rows of dy
// (linear_backward_weight), accumulated so micro-batches and tied weights add up.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId linear(Graph& g, ValueId x, ValueId w, ValueId b, const std::string& name);

extern const OpDef kLinear, kLinearBackwardInput, kLinearBackwardWeight;

}  // namespace engine::ops
