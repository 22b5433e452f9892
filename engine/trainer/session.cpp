#include "trainer/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "trainer/telemetry.h"

namespace engine {

namespace {

DType gradient_dtype(recipe::GradientDType t) {
  return t == recipe::GradientDType::bf16 ? DType::bf16 : t == recipe::GradientDType::fp16 ? DType::f16 : DType::f32;
}

}  // namespace

DType compute_dtype(const recipe::Recipe& r) {
  switch (r.precision.mode) {
    case recipe::PrecisionMode::bf16:
      return DType::bf16;
    case recipe::PrecisionMode::fp16:
      return DType::f16;
    default:
      return DType::f32;
  }
}

namespace {

ModelGraph build_differentiated(const recipe::Recipe& r, RecomputeReport& recompute) {
  const int64_t micro = *r.train.micro_batch_size, accumulation = *r.train.gradient_accumulation_steps;
  const int64_t rows = micro * (r.model.arch == recipe::Arch::mlp ? 1 : *r.data.sequence_length);
  // The gradient of the mean loss over every row of the optimizer step (all micro-batches).
  ModelGraph model = build_model(r, micro, 1.0 / double(rows * accumulation));
  apply_precision(model.graph, compute_dtype(r), gradient_dtype(r.precision.accumulation_dtype));
  autodiff(model.graph);
  recompute = apply_recompute(model.graph, r.activation_checkpointing);
  return model;
}

int64_t optimizer_state_bytes(const recipe::OptimizerSection& o, int64_t parameter_bytes) {
  if (o.type == recipe::OptimizerType::adamw) return 2 * parameter_bytes;  // first and second moments
  return o.momentum > 0 ? parameter_bytes : 0;                             // momentum buffer
}

}  // namespace

CompiledStep compile_step(const recipe::Recipe& r) {
  CompiledStep c;
  c.model = build_differentiated(r, c.recompute);
  const Graph& g = c.model.graph;
  c.train = plan_step(g, all_nodes(g), {c.model.losses});
  c.eval = plan_step(g, forward_nodes(g), {c.model.losses});
  c.eval.training = false;
  MemoryPlan& m = c.memory;
  m.parameters = g.param_count() * 4;
  m.gradients = m.parameters;
  m.optimizer_state = optimizer_state_bytes(r.optimizer, m.parameters);
  m.activations = std::max(c.train.arena_bytes, c.eval.arena_bytes);
  for (const Value& v : g.values()) {
    if (v.placement == Placement::input) m.inputs += value_bytes(v);
    if (v.placement == Placement::host) m.host += value_bytes(v);
  }
  if (compute_dtype(r) != DType::f32) m.copies += g.param_count() * 2;
  if (r.precision.accumulation_dtype != recipe::GradientDType::fp32) m.copies += g.param_count() * 2;
  m.scratch = std::max(c.train.scratch_bytes, c.eval.scratch_bytes);
  for (size_t index : c.train.nodes) {
    const Node& node = g.nodes()[index];
    if (node.op->flops) c.flops_per_micro_batch += node.op->flops(g, node);
  }
  return c;
}

void check_memory_available(const MemoryPlan& memory) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key != "MemAvailable:") continue;
    if (memory.total() > kilobytes * 1024)
      throw UserError("the plan needs " + format_bytes(memory.total()) + " (parameters " +
                      format_bytes(memory.parameters) + ", activations " + format_bytes(memory.activations) +
                      ") but only " + format_bytes(kilobytes * 1024) +
                      " is available; see `engine plan` and reduce the model or the micro-batch");
    return;
  }
}

Session::Session(const recipe::Recipe& r) : Session(r, compile_step(r)) {}

Session::Session(const recipe::Recipe& r, CompiledStep compiled)
    : recipe(r),
      data(make_dataset(r)),
      model(std::move(compiled.model)),
      store(model.graph),
      optimizer(make_optimizer(r.optimizer, store)),
      executor(model.graph, store, uint64_t(r.run.seed)),
      micro_batch(*r.train.micro_batch_size),
      accumulation(*r.train.gradient_accumulation_steps),
      scaler(r.precision),
      memory_(compiled.memory) {
  executor.add_plan("train", std::move(compiled.train));
  executor.add_plan("eval", std::move(compiled.eval));
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

double Session::train_micro_batch(const Batch& batch, int64_t step, int64_t micro, double loss_scale) {
  load_batch(batch);
  executor.run("train", uint64_t(step), uint64_t(micro), float(loss_scale));
  return mean_loss("train");
}

Session::StepResult Session::finish_step(double loss, double scale, const StepHooks& hooks) {
  store.widen_gradients();
  if (hooks.after_backward) hooks.after_backward();
  StepResult result;
  result.loss = loss;
  result.loss_scale = scale;
  result.lr = learning_rate(recipe, updates);
  const double scaled_norm = gradient_norm(store);
  if (!std::isfinite(scaled_norm) && scaler.enabled()) {
    result.grad_norm = scaled_norm;
    result.overflow = result.skipped = true;
    if (scaler.update(true) == LossScaler::Outcome::min_scale) {
      if (recipe.precision.on_min_scale == recipe::MinScaleAction::abort)
        throw UserError("fp16 gradients still overflow at the minimum loss scale " + std::to_string(scale) + " (" +
                        std::to_string(scaler.skipped()) +
                        " steps skipped so far); train in bf16 (precision.mode: bf16 has fp32's range), lower "
                        "precision.min_scale, or set precision.on_min_scale: fallback");
      fall_back_to_bf16();
      result.fell_back = true;
    }
    return result;
  }
  result.grad_norm = scaled_norm / scale;
  const double factor = clip_factor(result.grad_norm, recipe.train.gradient_clipping) / scale;
  if (hooks.before_update && !hooks.before_update(result)) {
    result.skipped = true;
    return result;
  }
  if (factor != 1.0) scale_gradients(store, factor);
  optimizer->step(result.lr);
  store.refresh_copies();
  scaler.update(false);
  ++updates;
  return result;
}

void Session::fall_back_to_bf16() {
  for (size_t i = 0; i < model.graph.values().size(); ++i)
    if (model.graph.values()[i].dtype == DType::f16) model.graph.mutable_value(ValueId(i)).dtype = DType::bf16;
  store.retype(DType::f16, DType::bf16);
  scaler.disable();
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

}  // namespace engine
