#include "trainer/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include "checkpoint/sharded_state.h"
#include "core/error.h"
#include "graph/autodiff.h"
#include "dist/zero_plan.h"
#include "graph/precision.h"
#include "graph/wrap.h"
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

WrapPolicySpec wrap_policy(const recipe::DistributedSection& d) {
  switch (d.wrap_policy) {
    case recipe::WrapPolicy::size:
      return {WrapPolicySpec::Kind::size, d.wrap_size};
    case recipe::WrapPolicy::model:
      return {WrapPolicySpec::Kind::model, d.wrap_size};
    case recipe::WrapPolicy::block:
      break;
  }
  return {WrapPolicySpec::Kind::block, d.wrap_size};
}

ModelGraph build_differentiated(const recipe::Recipe& r, int world, RecomputeReport& recompute) {
  const int64_t micro = *r.train.micro_batch_size, accumulation = *r.train.gradient_accumulation_steps;
  const int64_t rows = micro * (r.model.arch == recipe::Arch::mlp ? 1 : *r.data.sequence_length);
  // The gradient of the mean loss over every row of the optimizer step (all micro-batches of all
  // ranks).
  ModelGraph model = build_model(r, micro, 1.0 / double(rows * accumulation * world));
  apply_wrap_policy(model.graph, wrap_policy(r.distributed));
  apply_precision(model.graph, compute_dtype(r), gradient_dtype(r.precision.accumulation_dtype));
  autodiff(model.graph);
  recompute = apply_recompute(model.graph, r.activation_checkpointing);
  return model;
}

int64_t optimizer_state_bytes(const recipe::OptimizerSection& o, int64_t parameter_bytes) {
  return optimizer_state_tensors(o) * parameter_bytes;
}

// Bytes one rank sends in a collective over `bytes` of data split in `world` parts: reduce-scatter
// and all-gather both send every part but its own.
int64_t sent(int64_t bytes, int world) { return bytes / world * (world - 1); }

TrafficPlan plan_traffic(const Graph& g, const ShardLayout& layout, const ShardingSpec& spec, const Plan& train) {
  TrafficPlan t;
  const int world = layout.world();
  if (world == 1) return t;
  const int64_t psize = int64_t(dtype_size(g.param_dtype())), gsize = int64_t(dtype_size(g.grad_dtype()));
  for (const auto& list : train.actions)
    for (const StepAction& a : list) {
      if (a.kind == StepAction::Kind::reduce) t.gradients += sent(layout.padded(size_t(a.unit)) * gsize, world);
      if (a.kind == StepAction::Kind::gather) t.parameters += sent(layout.padded(size_t(a.unit)) * psize, world);
    }
  t.gradients *= spec.accumulation;
  t.parameters *= spec.accumulation;
  for (size_t u = 0; u < layout.units(); ++u) {
    if (spec.stage == 0) t.gradients += sent(layout.padded(u) * gsize, world);
    if (spec.stage == 1 || spec.stage == 2) t.parameters += sent(layout.padded(u) * psize, world);
  }
  return t;
}

// Whether gradients go through reduce-scatters (else the optimizer reads what the backward wrote).
bool gradients_reduced(const ShardingSpec& spec) { return spec.world > 1 || spec.accumulation > 1 || spec.stage >= 2; }

}  // namespace

CompiledStep compile_step(const recipe::Recipe& r, int world) {
  if (world > 1 && r.precision.communication_dtype != r.precision.accumulation_dtype)
    throw UserError(
        "precision.communication_dtype differs from precision.accumulation_dtype: gradients are reduced in the "
        "type they accumulate in, so that every ZeRO stage and world size sums the same bits; set "
        "communication_dtype to the accumulation_dtype (or accumulation_dtype to the type to communicate in)");
  CompiledStep c;
  c.model = build_differentiated(r, world, c.recompute);
  Graph& g = c.model.graph;
  c.sharding = ShardingSpec{world, 0, int(r.distributed.zero_stage), *r.train.gradient_accumulation_steps};
  const ShardLayout layout(g.units(), world, 0);
  const ZeroPlanSpec zero{int(r.distributed.zero_stage), gradients_reduced(c.sharding), r.distributed.bucket_size,
                          r.distributed.prefetch};
  c.train = plan_zero_step(g, layout, all_nodes(g), {c.model.losses}, zero, true);
  c.eval = plan_zero_step(g, layout, forward_nodes(g), {c.model.losses}, zero, false);
  c.eval.training = false;
  c.traffic = plan_traffic(g, layout, c.sharding, c.train);
  MemoryPlan& m = c.memory;
  const ParameterStore::Bytes store = ParameterStore::planned_bytes(g, c.sharding);
  m.parameters = store.parameters;
  m.gradients = store.gradients;
  m.optimizer_state = optimizer_state_bytes(r.optimizer, store.optimizer_elements * 4);
  m.activations = std::max(c.train.arena_bytes, c.eval.arena_bytes);
  if (!c.train.actions.empty() || !c.eval.actions.empty()) {
    const int64_t without = std::max(plan_step(g, c.train.nodes, {c.model.losses}).arena_bytes,
                                     plan_step(g, c.eval.nodes, {c.model.losses}).arena_bytes);
    m.zero_buffers = std::max<int64_t>(0, m.activations - without);
  }
  for (const Value& v : g.values()) {
    if (v.placement == Placement::input) m.inputs += value_bytes(v);
    if (v.placement == Placement::host) m.host += value_bytes(v);
  }
  m.scratch = std::max(c.train.scratch_bytes, c.eval.scratch_bytes);
  m.checkpoint_snapshot = rank_file_bytes(g, world, size_t(1 + optimizer_state_tensors(r.optimizer)));
  // A host communicator receives every peer's chunk of a reduce-scatter before summing them in
  // rank order (dist/communicator.h): one buffer, as large as the largest unit's gradient.
  if (world > 1)
    for (size_t u = 0; u < layout.units(); ++u)
      m.staging = std::max(m.staging, layout.padded(u) * int64_t(dtype_size(g.grad_dtype())));
  for (size_t index : c.train.nodes) {
    const Node& node = g.nodes()[index];
    if (node.op->flops) c.flops_per_micro_batch += node.op->flops(g, node);
  }
  return c;
}

void check_memory_available(const MemoryPlan& memory, int local_ranks) {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key != "MemAvailable:") continue;
    const int64_t needed = (memory.total() + memory.checkpoint_snapshot) * local_ranks;
    if (needed > kilobytes * 1024)
      throw UserError("the plan needs " + format_bytes(needed) +
                      (local_ranks > 1 ? " for " + std::to_string(local_ranks) + " ranks on this machine" : "") +
                      " (per rank: parameters " +
                      format_bytes(memory.parameters) + ", activations " + format_bytes(memory.activations) +
                      ", checkpoint snapshot " + format_bytes(memory.checkpoint_snapshot) +
                      ") but only " + format_bytes(kilobytes * 1024) +
                      " is available; see `engine plan` and reduce the model or the micro-batch");
    return;
  }
}

Session::Session(const recipe::Recipe& r) : Session(r, compile_step(r)) {}

namespace {

ShardingSpec rank_sharding(ShardingSpec spec, const dist::Communicator& comm) {
  ENGINE_CHECK(spec.world == comm.size(), "the step was compiled for world size " + std::to_string(spec.world) +
                                              ", the communicator has " + std::to_string(comm.size()) + " ranks");
  spec.rank = comm.rank();
  return spec;
}

}  // namespace

Session::Session(const recipe::Recipe& r, CompiledStep compiled, dist::Communicator* communicator)
    : recipe(r),
      own_comm(communicator ? nullptr : dist::make_local_communicator()),
      comm(communicator ? *communicator : *own_comm),
      rank(comm.rank()),
      world(comm.size()),
      data(make_dataset(r)),
      model(std::move(compiled.model)),
      store(model.graph, rank_sharding(compiled.sharding, comm)),
      optimizer(make_optimizer(r.optimizer, store)),
      executor(model.graph, store, uint64_t(r.run.seed)),
      zero(store, comm),
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
  if (store.sharding().stage < 2) store.zero_micro_grads();
  load_batch(batch);
  zero.begin_micro_batch(micro);
  // Dropout draws from the global micro-batch index, so every world size draws the same masks.
  executor.run("train", uint64_t(step), uint64_t(micro * world + rank), float(loss_scale), &zero);
  return mean_loss("train");
}

Session::StepResult Session::finish_step(double loss, double scale, const StepHooks& hooks) {
  zero.finish_gradients();
  if (hooks.after_backward) hooks.after_backward();
  StepResult result;
  result.loss = loss;
  result.loss_scale = scale;
  result.lr = learning_rate(recipe, updates);
  const double scaled_norm = zero.gradient_norm();
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
  if (hooks.before_update) {
    bool update = hooks.before_update(result);
    if (world > 1) {  // a plugin may decide from what only its rank sees: rank 0's decision holds
      result.lr = zero.gather(result.lr)[0];
      update = zero.gather(update ? 1.0 : 0.0)[0] != 0;
    }
    if (!update) {
      result.skipped = true;
      return result;
    }
  }
  if (factor != 1.0) scale_gradients(store, factor);
  optimizer->step(result.lr);
  zero.finish_update();
  scaler.update(false);
  ++updates;
  return result;
}

void Session::fall_back_to_bf16() {
  for (size_t i = 0; i < model.graph.values().size(); ++i)
    if (model.graph.values()[i].dtype == DType::f16) model.graph.mutable_value(ValueId(i)).dtype = DType::bf16;
  store.retype(DType::f16, DType::bf16);  // rounds this rank's masters anew ...
  zero.gather_parameters();                // ... and the other ranks' slices arrive (every rank falls back)
  scaler.disable();
}

double Session::evaluate(int64_t batches) {
  // Rank r evaluates batches r, r + world, ...; every rank runs as many (stage 3 gathers in each),
  // and the losses are summed in batch order, as one rank would.
  const int64_t rounds = (batches + world - 1) / world;
  std::vector<double> mine;
  Batch batch(micro_batch, model.sequence, data->features());
  for (int64_t k = 0; k < rounds; ++k) {
    data->fill(Split::validation, std::min(k * world + rank, batches - 1), batch);
    load_batch(batch);
    executor.run("eval", 0, 0, 1.0f, &zero);
    mine.push_back(mean_loss("eval"));
  }
  const std::vector<double> all = zero.gather(mine, "validation losses");
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) total += all[size_t((i % world) * rounds + i / world)];
  return total / double(batches);
}

}  // namespace engine
