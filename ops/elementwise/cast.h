// cast: converts a value between f32 and the 16-bit float types (bf16, f16), rounding to nearest
// even (core/dtype.h), the storage conversion of mixed precision.
//
//   x (shape, f32 | bf16 | f16) -> y (shape, dtype)
//
// Its gradient is the cast of the output gradient back to the input's dtype (straight through:
// rounding has no useful derivative, and frameworks treat it as the identity).
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId cast(Graph& g, ValueId x, DType dtype, const std::string& name);

extern const OpDef kCast;

}  // namespace engine::ops
