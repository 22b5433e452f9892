// Precision: the pass that turns an fp32 forward graph into a 16-bit one, and the table of which
// op computes in which precision.
//
// Run before autodiff (gradients take the type of the value they belong to). Parameters become
// 16-bit copies (the fp32 masters stay in the ParameterStore), parameter gradients take the
// accumulation type, float model inputs are cast once at the start, and every forward activation
// becomes 16-bit except the outputs an op keeps in fp32 (OpDef::fp32_outputs: normalisation
// statistics, the attention log-sum-exp, per-row losses, reductions). Kernels with a 16-bit path
// (OpDef::native_16bit) read the 16-bit values directly; the others compute in fp32 on widened
// copies (see Executor).
//
//   ModelGraph model = build_model(recipe, micro, scale);
//   apply_precision(model.graph, DType::bf16, DType::f32);
//   autodiff(model.graph);
//   std::cout << precision_table(model.graph, train_plan.nodes);
#pragma once

#include <string>
#include <vector>

#include "graph/graph.h"

namespace engine {

void apply_precision(Graph& graph, DType compute, DType gradient_accumulation);

// One line per op kind among `nodes`: how many run, the types they store, how they compute.
std::string precision_table(const Graph& graph, const std::vector<size_t>& nodes);

}  // namespace engine
