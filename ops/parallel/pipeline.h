// A pipeline stage's edges (pipeline parallelism, models/pipeline_stage.h): the activation a stage
// receives from the one before and the activation it hands to the one after, both fp32 whatever the
// graph computes in (16-bit values widen and round back exactly), so a stage's forward and backward
// are the whole model's, op for op.
//
//   stage_input   received (B, T, C) f32, an input marked differentiable -> x in the graph's type;
//                 backward: the received value's gradient, widened to fp32 (what goes back).
//   stage_output  x -> (B, T, C) f32 (what goes on), the stage graph's loss: its backward seeds x's
//                 gradient from `received_gradient`, an f32 input the next stage's backward sent.
#pragma once

#include "op_util.h"

namespace engine::ops {

ValueId stage_input(Graph& g, ValueId received, const std::string& name);
ValueId stage_output(Graph& g, ValueId x, ValueId received_gradient, const std::string& name);

extern const OpDef kStageInput, kStageInputGrad, kStageOutput, kStageOutputGrad;

}  // namespace engine::ops
