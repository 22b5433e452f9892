#include "runtime/executor.h"

#include "core/error.h"

namespace engine {

Executor::Executor(const Graph& graph, ParameterStore& parameters, uint64_t seed)
    : graph_(graph), parameters_(parameters), seed_(seed) {
  for (size_t i = 0; i < graph.values().size(); ++i) {
    const Value& v = graph.values()[i];
    if (v.placement == Placement::input) inputs_.emplace(ValueId(i), Buffer(value_bytes(v)));
  }
}

void Executor::add_plan(const std::string& name, Plan plan) {
  if (plan.arena_bytes > arena_.bytes()) arena_ = Buffer(plan.arena_bytes);
  plans_[name] = std::move(plan);
}

float* Executor::value_f32(const std::string& plan, ValueId id) {
  int64_t offset = plans_.at(plan).offsets[size_t(id)];
  ENGINE_CHECK(offset >= 0, "value " + graph_.value(id).name + " is not placed by plan " + plan);
  return reinterpret_cast<float*>(arena_.data() + offset);
}

void Executor::run(const std::string& name, uint64_t step, uint64_t micro_step) {
  const Plan& plan = plans_.at(name);
  KernelContext ctx;
  ctx.graph = &graph_;
  ctx.seed = seed_;
  ctx.step = step;
  ctx.micro_step = micro_step;
  ctx.pointers.assign(graph_.values().size(), nullptr);
  for (size_t i = 0; i < graph_.values().size(); ++i) {
    const Value& v = graph_.values()[i];
    switch (v.placement) {
      case Placement::activation:
        if (plan.offsets[i] >= 0) ctx.pointers[i] = arena_.data() + plan.offsets[i];
        break;
      case Placement::parameter:
        ctx.pointers[i] = parameters_.param(v.param);
        break;
      case Placement::gradient:
        ctx.pointers[i] = parameters_.grad(v.param);
        break;
      case Placement::input:
        ctx.pointers[i] = inputs_.at(ValueId(i)).data();
        break;
    }
  }
  for (size_t index : plan.nodes) {
    const Node& node = graph_.nodes()[index];
    node.op->cpu(node, ctx);
  }
}

}  // namespace engine
