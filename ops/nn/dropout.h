// dropout: zeroes each element with probability p and scales the survivors by 1 / (1 - p).
//
//   x (any shape) -> y;  attrs: p, and a per-node salt so every dropout site draws its own mask
//
// The mask is never stored: it is a pure function of (run seed, step, micro-step, salt, element),
// drawn from Philox, so the backward (dropout_backward: dx = dy * mask / (1 - p)) regenerates it,
// any thread count gives the same mask, and a resumed run draws the masks it would have drawn.
// Plans that do not train (evaluation, generation) pass values through unchanged.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId dropout(Graph& g, ValueId x, double p, const std::string& name);

extern const OpDef kDropout, kDropoutBackward;

}  // namespace engine::ops
