// rotary: rotary position embedding applied to the q and k parts of packed qkv (Llama), in the
// "rotate half" convention of Hugging Face's Llama: within each head, element i pairs with i + hd/2.
//
//   qkv (B, T, 3C) -> (B, T, 3C);  angle(t, i) = t * theta^(-2i / hd),  i < hd / 2
//   (x_i, x_{i+hd/2}) -> (x_i cos - x_{i+hd/2} sin,  x_i sin + x_{i+hd/2} cos);  v is copied
//
// Backward rotates the gradient by the opposite angle (the rotation is orthogonal).
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId rotary(Graph& g, ValueId qkv, int64_t n_head, double theta, const std::string& name);

extern const OpDef kRotary, kRotaryBackward;

}  // namespace engine::ops
