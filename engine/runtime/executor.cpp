#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/convert.h"
#include "core/error.h"
#include "runtime/value_binding.h"
#include "telemetry/trace.h"

namespace engine {

Executor::Executor(const Graph& graph, ParameterStore& parameters, uint64_t seed, Device device)
    : graph_(graph), parameters_(parameters), seed_(seed), device_(device) {
  if (device.kind == Device::Kind::cuda) runner_ = make_device_runner(graph, parameters, device.index);
  for (size_t i = 0; i < graph.values().size(); ++i) {
    const Value& v = graph.values()[i];
    if (v.placement == Placement::input || v.placement == Placement::host)
      inputs_.emplace(ValueId(i), Buffer(value_bytes(v)));
  }
  unit_params_.resize(graph.units().size());
  for (size_t i = 0; i < graph.params().size(); ++i) unit_params_[size_t(graph.params()[i].unit)].push_back(int(i));
}

Executor::~Executor() = default;

void Executor::add_plan(const std::string& name, Plan plan) {
  // A plan made before a later one added values to the graph (stage 3's gathered parameters of the
  // evaluation plan) does not place those values.
  plan.offsets.resize(graph_.values().size(), -1);
  if (runner_) {
    runner_->add_plan(name, plan);  // the device holds the arena: the host allocates none
  } else {
    if (plan.arena_bytes > arena_.bytes()) arena_ = Buffer(plan.arena_bytes);
    if (plan.scratch_bytes > scratch_.bytes()) scratch_ = Buffer(plan.scratch_bytes);
  }
  plans_[name] = std::move(plan);
}

std::byte* Executor::arena_buffer(const std::string& plan, ValueId id) {
  ENGINE_CHECK(!runner_, "arena buffers are device memory on CUDA");
  return arena_.data() + plans_.at(plan).offsets[size_t(id)];
}

int64_t cuda_scratch_bytes(const Graph& graph, const Plan& plan) {
  int64_t bytes = 0;
  for (size_t index : plan.nodes)
    bytes = std::max(bytes, conversion_bytes(graph, graph.nodes()[index], Device::Kind::cuda));
  return bytes;
}

float* Executor::value_f32(const std::string& plan, ValueId id) {
  if (runner_) return const_cast<float*>(runner_->value_f32(plan, plans_.at(plan), id));
  int64_t offset = plans_.at(plan).offsets[size_t(id)];
  ENGINE_CHECK(offset >= 0, "value " + graph_.value(id).name + " is not placed by plan " + plan);
  return reinterpret_cast<float*>(arena_.data() + offset);
}

void Executor::run_actions(const Plan& plan, size_t position, KernelContext& ctx, StepCommunication* communication,
                           const StepAction* only) {
  for (const StepAction& action : plan.actions[position]) {
    if (only && &action != only) continue;
    std::byte* buffer = action.buffer == kNoValue ? nullptr : arena_.data() + plan.offsets[size_t(action.buffer)];
    auto bind = [&](bool gradients) {
      for (int index : unit_params_[size_t(action.unit)]) {
        const Param& p = graph_.params()[size_t(index)];
        const ValueId id = gradients ? p.grad : p.value;
        ctx.pointers[size_t(id)] = buffer + p.offset * int64_t(dtype_size(graph_.value(id).dtype));
      }
    };
    switch (action.kind) {
      case StepAction::Kind::grads_into:
        std::memset(buffer, 0, size_t(value_bytes(graph_.value(action.buffer))));
        bind(true);
        break;
      case StepAction::Kind::use_params:
        communication->run(action, buffer);
        bind(false);
        break;
      default:
        communication->run(action, buffer);
    }
  }
}

void Executor::run_node(const Node& node, KernelContext& ctx) {
  if (!needs_conversion(graph_, node)) return node.op->cpu(node, ctx);
  copies_.run(
      graph_, node, ctx, scratch_.data(), node.op->cpu,
      [](const void* src, DType type, float* dst, int64_t n) { widen(src, type, dst, n); },
      [](const float* src, void* dst, DType type, int64_t n) { narrow(src, dst, type, n); });
}

NodeWork node_work(const Graph& graph, const Node& node) {
  NodeWork work;
  if (node.op->flops) work.flops = node.op->flops(graph, node);
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    work.bytes += double(value_bytes(graph.value(node.inputs[i]))) * (overwrites_input(node, i) ? 2 : 1);
  }
  // An output the kernel adds to (KernelContext::accumulates: a gradient) is read before it is written.
  for (ValueId id : node.outputs) {
    const Value& value = graph.value(id);
    const bool accumulated = node.accumulate || value.placement == Placement::gradient;
    work.bytes += double(value_bytes(value)) * (accumulated ? 2 : 1);
  }
  return work;
}

void Executor::run_timed(const Node& node, KernelContext& ctx) {
  trace::Scope event("op", node.op->name);
  const NodeWork work = node_work(graph_, node);
  if (event.active()) {
    event.set_work(work.flops, work.bytes);
    event.set_detail(node.name);
  }
  const auto start = std::chrono::steady_clock::now();
  run_node(node, ctx);
  if (!op_table_) return;
  OpTotals& totals = op_totals_[node.op->name];
  totals.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  totals.calls += 1;
  totals.flops += work.flops;
  totals.bytes += work.bytes;
}

namespace {

const char* action_name(StepAction::Kind kind) {
  switch (kind) {
    case StepAction::Kind::gather:
      return "start all-gather";
    case StepAction::Kind::use_params:
      return "wait all-gather";
    case StepAction::Kind::grads_into:
      return "zero gradient buffer";
    case StepAction::Kind::reduce:
      return "start reduce-scatter";
    case StepAction::Kind::wait:
      return "wait reduce-scatter";
  }
  return "?";
}

}  // namespace

void Executor::run(const std::string& name, uint64_t step, uint64_t micro_step, float loss_scale,
                   StepCommunication* communication) {
  const Plan& plan = plans_.at(name);
  ENGINE_CHECK(plan.actions.empty() || communication, "plan " + name + " communicates but has no communicator");
  ENGINE_CHECK(plan.offsets.size() == graph_.values().size(), "plan " + name + " was made for another graph");
  KernelContext ctx;
  ctx.seed = seed_;
  ctx.step = step;
  ctx.micro_step = micro_step;
  ctx.training = plan.training;
  ctx.loss_scale = loss_scale;
  ctx.tensor_group = tensor_group_;
  if (runner_)
    return runner_->run(name, plan, std::move(ctx), inputs_, op_table_ ? &op_totals_ : nullptr, communication);
  ctx.graph = &graph_;
  bind_values(graph_, plan, arena_.data(), ctx, [&](const Value& v, ValueId id) -> void* {
    switch (v.placement) {
      case Placement::parameter:
        return parameters_.param_storage(v.param);
      case Placement::gradient:
        return parameters_.grad_storage(v.param);
      case Placement::frozen:
        return parameters_.frozen_storage(v.param);
      default:  // input, host
        return inputs_.at(id).data();
    }
  });
  const bool acts = !plan.actions.empty();
  const bool timed = op_table_ || trace::recording();
  auto act = [&](size_t position) {
    if (!timed || plan.actions[position].empty()) return run_actions(plan, position, ctx, communication);
    const auto start = std::chrono::steady_clock::now();
    for (const StepAction& action : plan.actions[position]) {
      trace::Scope event(action.kind == StepAction::Kind::grads_into ? "other" : "communication",
                         action_name(action.kind));
      if (event.active()) event.set_detail(graph_.units()[size_t(action.unit)].name);
      run_actions(plan, position, ctx, communication, &action);
    }
    if (op_table_) {
      OpTotals& totals = op_totals_["(communication)"];
      totals.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      totals.calls += 1;
    }
  };
  for (size_t position = 0; position < plan.nodes.size(); ++position) {
    if (acts) act(position);
    const Node& node = graph_.nodes()[plan.nodes[position]];
    if (timed)
      run_timed(node, ctx);
    else
      run_node(node, ctx);
  }
  if (acts) act(plan.nodes.size());
}

}  // namespace engine
