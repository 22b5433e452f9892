#include "graph/autodiff.h"

#include "core/error.h"
#include "cuda_kernels.h"

namespace engine {

const OpDef kAccumulate{
    .name = "accumulate",
    .cpu = copy_kernel,
    .cuda = cuda::copy,
    .flops = [](const Graph& g, const Node& n) { return double(g.value(n.inputs[0]).shape.numel()); },
    .native_16bit = "any types, fp32 arithmetic",
    .cuda_16bit = "any types, fp32 arithmetic"};

GradBuilder::GradBuilder(Graph& graph) : graph_(graph), wants_(graph.values().size(), false) {
  for (const auto& param : graph.params()) wants_[static_cast<size_t>(param.value)] = true;
  for (ValueId input : graph.differentiable()) wants_[static_cast<size_t>(input)] = true;
  for (size_t i = 0; i < graph.forward_size(); ++i) {
    const Node& node = graph.nodes()[i];
    bool any = false;
    for (ValueId in : node.inputs) any = any || wants_[static_cast<size_t>(in)];
    if (any && node.op->grad)
      for (ValueId out : node.outputs) wants_[static_cast<size_t>(out)] = true;
  }
}

ValueId GradBuilder::grad(ValueId value) const {
  auto it = grads_.find(value);
  return it == grads_.end() ? kNoValue : it->second;
}

GradBuilder::Target GradBuilder::target(ValueId value) {
  const Value& v = graph_.value(value);
  if (v.placement == Placement::parameter) return {graph_.params()[static_cast<size_t>(v.param)].grad, true};
  auto it = grads_.find(value);
  if (it == grads_.end()) {
    ValueId grad = graph_.add_activation("d" + v.name, v.shape, v.dtype);
    grads_[value] = grad;
    grad_owners_[grad] = 1;
    return {grad, false};
  }
  if (grad_owners_[it->second] == 1) return {it->second, true};
  // The gradient is shared with another value (an identity pass-through): adding in place would
  // change the other's gradient too, so this value gets a copy first.
  ValueId copy = graph_.add_activation("d" + v.name, v.shape, v.dtype);
  graph_.add_node(Node{&kAccumulate, {it->second}, {copy}, {}, false, true, v.name});
  grad_owners_[it->second] -= 1;
  it->second = copy;
  grad_owners_[copy] = 1;
  return {copy, true};
}

void GradBuilder::emit(const OpDef& op, std::vector<ValueId> inputs, std::vector<ValueId> outputs, Target target,
                       Attrs attrs, const std::string& name) {
  Node node{&op, std::move(inputs), std::move(outputs), std::move(attrs), target.accumulate, true, name};
  graph_.add_node(std::move(node));
}

void GradBuilder::pass_through(ValueId value, ValueId grad, const std::string& name) {
  if (!wants(value)) return;
  const Value& v = graph_.value(value);
  auto it = grads_.find(value);
  if (v.placement != Placement::parameter && it == grads_.end()) {
    grads_[value] = grad;
    grad_owners_[grad] += 1;
    return;
  }
  Target t = target(value);
  graph_.add_node(Node{&kAccumulate, {grad}, {t.value}, {}, t.accumulate, true, name});
}

void autodiff(Graph& graph) {
  ENGINE_CHECK(graph.loss() != kNoValue, "autodiff needs a loss");
  if (graph.forward_size() == 0) graph.mark_forward_end();
  GradBuilder builder(graph);
  const size_t forward = graph.forward_size();
  for (size_t i = forward; i-- > 0;) {
    const Node node = graph.nodes()[i];  // a copy: rules append to the node list
    if (!node.op->grad) continue;
    bool is_loss = false;
    bool has_grad = false;
    for (ValueId out : node.outputs) {
      is_loss = is_loss || out == graph.loss();
      has_grad = has_grad || builder.grad(out) != kNoValue;
    }
    bool wanted = false;
    for (ValueId in : node.inputs) wanted = wanted || builder.wants(in);
    if ((is_loss || has_grad) && wanted) node.op->grad(builder, node);
  }
}

}  // namespace engine
