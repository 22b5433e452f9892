#include "trainer/session.h"

#include <cstring>

#include "graph/autodiff.h"

namespace engine {

namespace {

ModelGraph build_differentiated(const recipe::Recipe& r) {
  const int64_t micro = *r.train.micro_batch_size, accumulation = *r.train.gradient_accumulation_steps;
  const int64_t rows = micro * (r.model.arch == recipe::Arch::mlp ? 1 : *r.data.sequence_length);
  // The gradient of the mean loss over every row of the optimizer step (all micro-batches).
  ModelGraph model = build_model(r, micro, 1.0 / double(rows * accumulation));
  autodiff(model.graph);
  return model;
}

}  // namespace

Session::Session(const recipe::Recipe& r)
    : recipe(r),
      data(make_dataset(r)),
      model(build_differentiated(r)),
      store(model.graph),
      optimizer(make_optimizer(r.optimizer, store)),
      executor(model.graph, store, uint64_t(r.run.seed)),
      micro_batch(*r.train.micro_batch_size),
      accumulation(*r.train.gradient_accumulation_steps) {
  executor.add_plan("train", plan_step(model.graph, all_nodes(model.graph), {model.losses}));
  Plan eval = plan_step(model.graph, forward_nodes(model.graph), {model.losses});
  eval.training = false;
  executor.add_plan("eval", std::move(eval));
}

void Session::load_batch(const Batch& batch) {
  if (!batch.tokens.empty())
    std::memcpy(executor.input(model.inputs), batch.tokens.data(), batch.tokens.size() * 4);
  else
    std::memcpy(executor.input(model.inputs), batch.inputs.data(), batch.inputs.size() * 4);
  std::memcpy(executor.input(model.targets), batch.targets.data(), batch.targets.size() * 4);
}

double Session::mean_loss(const std::string& plan) {
  const float* losses = executor.value_f32(plan, model.losses);
  const int64_t rows = model.graph.value(model.losses).shape.numel();
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i) sum += losses[i];
  return sum / double(rows);
}

double Session::train_micro_batch(const Batch& batch, int64_t step, int64_t micro) {
  load_batch(batch);
  executor.run("train", uint64_t(step), uint64_t(micro));
  return mean_loss("train");
}

double Session::evaluate(int64_t batches) {
  double total = 0;
  Batch batch(micro_batch, model.sequence, data->features());
  for (int64_t i = 0; i < batches; ++i) {
    data->fill(Split::validation, i, batch);
    load_batch(batch);
    executor.run("eval", 0, 0);
    total += mean_loss("eval");
  }
  return total / double(batches);
}

MemoryPlan Session::memory() const {
  MemoryPlan m;
  m.parameters = model.graph.param_count() * 4;
  m.gradients = m.parameters;
  m.optimizer_state = optimizer->state_bytes();
  m.activations = std::max(executor.plan("train").arena_bytes, executor.plan("eval").arena_bytes);
  for (const Value& v : model.graph.values())
    if (v.placement == Placement::input) m.inputs += value_bytes(v);
  return m;
}

double Session::flops_per_micro_batch() const {
  double flops = 0;
  for (size_t index : executor.plan("train").nodes) {
    const Node& node = model.graph.nodes()[index];
    if (node.op->flops) flops += node.op->flops(model.graph, node);
  }
  return flops;
}

}  // namespace engine
