// Wrap policy: the graph pass that regroups a built model's wrap units before autodiff.
//
// Model builders make one unit per repeated block plus the embeddings and the head (Graph::add_unit).
// A unit is what ZeRO-3 gathers and releases together, what offload moves together, and what
// activation checkpointing (full, every_k) takes as one segment, so its size trades memory for
// fewer, larger operations. The pass merges consecutive units in unit order:
//
//   block  units stay as the builder made them
//   size   consecutive units merge while the merged unit holds at most max_params parameters;
//          a unit that alone holds more stays a unit of its own (units are never split)
//   model  one unit for the whole model
//
// A merged unit lays its parameters out in the order of the units it replaces (each parameter's
// offset grows by the sizes of the units before its own), so the concatenation of all unit buffers,
// the parameter initialisation and every parameter's name and shape are unchanged: training with
// any policy is bit-identical. It is named after the units it spans, "first-last" ("h.0-h.3",
// "embeddings-head"); a unit left alone keeps its name. It is a block when it holds at least one
// block, and its forward nodes (Node::unit) follow it.
//
//   ModelGraph model = build_model(recipe, micro, scale);
//   apply_wrap_policy(model.graph, {WrapPolicySpec::Kind::size, 50'000'000});
//   apply_precision(model.graph, compute, accumulation);
//   autodiff(model.graph);
#pragma once

#include <cstdint>

#include "graph/graph.h"

namespace engine {

struct WrapPolicySpec {
  enum class Kind { block, size, model } kind = Kind::block;
  int64_t max_params = 0;  // size: parameters per merged unit, at most (>= 1)
};

// Runs on a graph with no ParameterStore yet (buffers are allocated per unit) and before autodiff.
void apply_wrap_policy(Graph& graph, const WrapPolicySpec& spec);

}  // namespace engine
