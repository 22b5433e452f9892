// Recompute: activation checkpointing as a graph pass, run after autodiff and before planning.
//
// A checkpointed segment of forward nodes does not keep its activations for the backward: the pass
// clones the segment's nodes, inserts the clones just before the first backward node that reads
// one of the segment's activations, and points every backward reader at the clones. The planner
// then sees the originals die at the end of their forward use, so the activation arena of the
// plan (and `engine plan`) shows what each policy saves; the clones' FLOPs are what it costs.
// The clones run the same kernels on the same inputs (dropout masks come from the node's own salt
// and the step), so losses and gradients are bit-identical to the plain graph.
//
//   full       segments are the wrap units that hold a block (Unit::block): one per block as built,
//              or the units the wrap policy merged (graph/wrap.h), a merged unit being one segment;
//              a segment keeps only its inputs
//   every_k    such units 0, k, 2k, ...
//   selective  each normalisation, activation function, rotary and dropout node in such a unit is
//              its own segment: matmul outputs are kept and these cheap ops are recomputed from them
//
// With `offload` (cpu_checkpointing, full and every_k), the kept input of each checkpointed block
// moves to a host value after its last forward use and is copied back (prefetched) just before
// the backward of the block after it, so it never occupies the arena in between.
//
//   autodiff(model.graph);
//   RecomputeReport report = apply_recompute(model.graph, recipe.activation_checkpointing);
//   Plan train = plan_step(model.graph, all_nodes(model.graph));
#pragma once

#include <cstdint>

#include "graph/graph.h"
#include "graph/op.h"
#include "recipe/recipe.h"

namespace engine {

struct RecomputeReport {
  int segments = 0;             // checkpointed segments that had activations to recompute
  int64_t cloned_nodes = 0;     // forward nodes run a second time per step
  double extra_flops = 0;       // their FLOPs per micro-batch
  int64_t offloaded_bytes = 0;  // block inputs held in host memory between forward and backward
};

RecomputeReport apply_recompute(Graph& graph, const recipe::ActivationCheckpointingSection& policy);

// Copies a value's bytes to another value of the same shape and type (offload and prefetch).
extern const OpDef kHostCopy;

}  // namespace engine
