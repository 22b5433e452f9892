// dropout: zeroes each element with probability p and scales the survivors by 1 / (1 - p).
//
//   x (any shape) -> y;  attrs: p, and a per-node salt so every dropout site draws its own mask
//
// The mask is never stored: it is a pure function of (run seed, step, micro-step, salt, element),
// drawn from Philox, so the backward (dropout_backward: dx = dy * mask / (1 - p)) regenerates it,
// any thread count gives the same mask, and a resumed run draws the masks it would have drawn.
// Plans that do not train (evaluation, generation) pass values through unchanged.
//
// dropout_columns: the same mask on a tensor-parallel rank's columns [column_begin, column_begin + w)
// of an input whose last dimension is `columns` wide, so a split input drops what the whole one
// drops (attrs: salt, columns, column_begin). CPU only, as tensor parallelism is.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId dropout(Graph& g, ValueId x, double p, const std::string& name);
ValueId dropout_columns(Graph& g, ValueId x, double p, int64_t columns, int64_t column_begin, const std::string& name);

extern const OpDef kDropout, kDropoutBackward, kDropoutColumns, kDropoutColumnsBackward;

}  // namespace engine::ops
