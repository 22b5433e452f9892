// Autodiff: appends the backward pass to a forward graph, in reverse node order, from each op's
// gradient rule. Rules emit ordinary nodes (ops whose kernels compute the gradients), so the
// planner and executor treat forward and backward alike.
//
// Parameter gradients accumulate into the gradient buffers (kernels add to them), which is also
// how micro-batches accumulate. A value used twice gets the sum of its gradients: the first
// contribution is written, later ones are added.
//
//   Graph g = build_gpt(recipe);      // forward, ending in a loss
//   autodiff(g);                      // + backward
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "graph/graph.h"
#include "graph/op.h"

namespace engine {

class GradBuilder {
 public:
  explicit GradBuilder(Graph& graph);

  Graph& graph() { return graph_; }
  // The gradient of a forward value, or kNoValue if nothing downstream depends on it.
  ValueId grad(ValueId value) const;
  // Whether `value` needs a gradient: it is a parameter or depends on one.
  bool wants(ValueId value) const { return wants_[static_cast<size_t>(value)]; }

  // Where a rule writes the gradient of `value`: a new activation (written), or for parameters and
  // values that already hold a gradient, the existing one (added to).
  struct Target {
    ValueId value;
    bool accumulate;
  };
  Target target(ValueId value);
  // Emits a backward node whose only activation output is `target`.
  void emit(const OpDef& op, std::vector<ValueId> inputs, std::vector<ValueId> outputs, Target target, Attrs attrs,
            const std::string& name);
  // For ops whose gradient is the identity: `value` gets `grad` itself (or has it added).
  void pass_through(ValueId value, ValueId grad, const std::string& name);

 private:
  friend void autodiff(Graph& graph);
  Graph& graph_;
  std::vector<bool> wants_;
  std::unordered_map<ValueId, ValueId> grads_;    // forward value -> its gradient value
  std::unordered_map<ValueId, int> grad_owners_;  // gradient value -> forward values sharing it
};

// Appends backward nodes for graph.loss(). The loss op's own rule seeds the gradient.
void autodiff(Graph& graph);

// The op that adds one gradient to another in place (used by autodiff, and by tests).
extern const OpDef kAccumulate;

}  // namespace engine
