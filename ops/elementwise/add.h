// add: y = a + b for two values of one shape (the residual connection). Its gradient is the
// identity for both inputs, so autodiff passes dy through without a kernel.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId add(Graph& g, ValueId a, ValueId b, const std::string& name);

extern const OpDef kAdd;

}  // namespace engine::ops
