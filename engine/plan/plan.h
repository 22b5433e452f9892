// Plan: the static schedule of a step and where every activation lives.
//
// The planner takes the nodes a step runs (forward only for evaluation, forward + backward for
// training), computes each activation's live interval (first to last node that touches it) and
// gives it an offset in one arena so that values alive at the same time never overlap. A step then
// allocates nothing, and the arena size is the activation peak, known before the first step.
//
//   Plan train = plan_step(graph, all_nodes(graph));
//   Plan eval = plan_step(graph, forward_nodes(graph));
//   std::printf("activations: %lld bytes\n", train.arena_bytes);
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"

namespace engine {

// Work between nodes that is not a kernel: a collective started or waited for, or a unit's
// parameters or gradients pointed at an arena buffer (dist/zero_plan.h places them).
struct StepAction {
  enum class Kind {
    gather,      // start the all-gather of `unit`'s parameters into `buffer`
    use_params,  // wait for that gather; the unit's parameter values now live in `buffer`
    grads_into,  // zero `buffer`; the unit's gradient values now live in it
    reduce,      // start the reduce-scatter of `unit`'s gradients (from `buffer`, or the store's)
    wait,        // wait for `unit`'s reduce-scatter
  };
  Kind kind;
  int unit = -1;
  ValueId buffer = kNoValue;  // an arena value, or kNoValue for the parameter store's own buffer
};

// A buffer that no node reads or writes but that must stay live from position `first` to `last`
// (inclusive; positions index Plan::nodes, nodes.size() is the end of the step).
struct LiveRange {
  ValueId value;
  int first, last;
};

struct Plan {
  std::vector<size_t> nodes;  // indices into graph.nodes(), in execution order
  // actions[i] run before nodes[i]; actions[nodes.size()] after the last node. Empty when the
  // step has no communication (one rank).
  std::vector<std::vector<StepAction>> actions;
  std::vector<int64_t> offsets;  // per ValueId: byte offset in the arena, -1 if not an activation of this plan
  int64_t arena_bytes = 0;
  int64_t unplaced_bytes = 0;  // sum of all activation sizes: what no reuse would cost
  int64_t scratch_bytes = 0;   // f32 copies for kernels without a 16-bit path (graph/op.h)
  bool training = true;        // whether kernels run in training mode (dropout on)
};

std::vector<size_t> forward_nodes(const Graph& graph);
std::vector<size_t> all_nodes(const Graph& graph);

// `keep` lists activations the caller reads after the step (the per-row losses): they stay live
// to the end of the plan instead of being overwritten once their last consumer has run.
Plan plan_step(const Graph& graph, std::vector<size_t> nodes, const std::vector<ValueId>& keep = {},
               const std::vector<LiveRange>& buffers = {});

}  // namespace engine
