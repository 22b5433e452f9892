#include "trainer/session.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>

#include "checkpoint/sharded_state.h"
#include "core/error.h"
#include "core/memory_limit.h"
#include "dist/zero_plan.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "graph/wrap.h"
#include "loss/cross_entropy.h"
#include "offload/offloaded_optimizer.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "runtime/mirror_pool.h"
#include "trainer/fit.h"
#include "trainer/progress_line.h"

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

ModelGraph build_differentiated(const recipe::Recipe& r, int world, TensorLayout tensor, PipelineLayout pipeline,
                                RecomputeReport& recompute, FusionReport& fusions) {
  const int64_t micro = *r.train.micro_batch_size, accumulation = *r.train.gradient_accumulation_steps;
  const int64_t rows = micro * (r.model.arch == recipe::Arch::mlp ? 1 : *r.data.sequence_length);
  // The gradient of the mean loss over every row of the optimizer step (all micro-batches of all
  // ranks).
  ModelGraph model = build_model(r, micro, 1.0 / double(rows * accumulation * world), tensor);
  if (pipeline.stages > 1)  // this rank's stage of the whole model (models/pipeline_stage.h)
    model = cut_stage(model, pipeline.stage, pipeline_boundaries(r, pipeline.stages, tensor.size));
  apply_wrap_policy(model.graph, wrap_policy(r.distributed));
  apply_precision(model.graph, compute_dtype(r), gradient_dtype(r.precision.accumulation_dtype));
  autodiff(model.graph);
  for (const Node& node : model.graph.nodes())
    if (node.op == &ops::kStageInputGrad) model.stage_input_gradient = node.outputs[0];
  recompute = apply_recompute(model.graph, r.activation_checkpointing);
  // The GPU's fused kernels (FusionReport); a CPU plan keeps every op its own kernel.
  if (r.run.fusions && planned_for_cuda(r)) {
    fusions.gelu = ops::fuse_linear_gelu(model.graph);
    fusions.gradient_copies = ops::fuse_gradient_copies(model.graph);
    fusions.residual_norms = ops::fuse_residual_norms(model.graph);
    fusions.bias_gradients = ops::fuse_norm_bias_gradients(model.graph);
  }
  if (!r.run.deterministic && planned_for_cuda(r))
    fusions.unordered_attention = ops::allow_unordered_attention_sums(model.graph);
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

// Where offload moves memory (MemoryPlan) and how many bytes it moves per step (TrafficPlan), from
// the same sizes OffloadedState and ChunkStore allocate.
void plan_offload(const recipe::Recipe& r, const Graph& g, const ShardLayout& layout, CompiledStep& c) {
  const OffloadSpec& o = c.offload;
  if (!o.any()) return;
  MemoryPlan& m = c.memory;
  const int stage = c.sharding.stage;
  int64_t elements = 0, largest_shard = 0;
  std::vector<int64_t> base;
  for (size_t u = 0; u < layout.units(); ++u) {
    base.push_back(elements);
    elements += ParameterStore::range_size(layout, c.sharding, u);
    largest_shard = std::max(largest_shard, layout.shard(u));
  }
  const int64_t chunks = OffloadedState::chunk_count(elements, o.chunk_size);
  const int64_t psize = int64_t(dtype_size(g.param_dtype()));
  if (o.optimizer != OffloadTier::none) {
    const auto kinds = int64_t(offloaded_kinds(r.optimizer, o.masters_offloaded(g.param_dtype(), stage)).size());
    const int64_t bytes = chunks * kinds * o.chunk_size * 4;
    m.optimizer_state = 0;  // the moments; offloaded masters were never in m.parameters
    // A streamed checkpoint reads the offloaded kinds through one piece (stream_rank); with the
    // optimizer on nvme every checkpoint streams (write_checkpoint), never snapshotted.
    m.streamed_checkpoint = kinds > 0 ? kStreamPieceElements * 4 : 0;
    if (o.optimizer == OffloadTier::nvme || !r.checkpoint.async) m.checkpoint_snapshot = m.streamed_checkpoint;
    if (o.optimizer == OffloadTier::cpu) {
      m.optimizer_state = bytes;
    } else if (kinds > 0) {
      m.swap += bytes;
      m.offload_buffers += kChunkSlots * kinds * o.chunk_size * 4 + ChunkStore::kBounceBytes;
      c.traffic.swap_read += bytes;
      c.traffic.swap_written += bytes;
    }
  }
  if (stage == 3 && o.parameters != OffloadTier::none) {
    const int64_t bytes = chunks * o.chunk_size * psize;
    if (o.parameters == OffloadTier::cpu) {
      m.parameters += bytes;
    } else {
      m.swap += bytes;
      m.offload_buffers += kChunkSlots * o.chunk_size * psize + ChunkStore::kBounceBytes;
      m.offload_buffers +=
          ZeroStep::fetch_slots(r.distributed.prefetch) * ChunkStore::fetch_slot_bytes(largest_shard * psize);
      c.traffic.swap_written += bytes;
      // Each gather reads the unit's shard, widened to the 4 KiB grid, in every micro-batch.
      int64_t per_micro = 0;
      for (const auto& list : c.train.actions)
        for (const StepAction& a : list)
          if (a.kind == StepAction::Kind::gather)
            per_micro +=
                ChunkStore::aligned(base[size_t(a.unit)] * psize, layout.shard(size_t(a.unit)) * psize).bytes();
      c.traffic.swap_read += per_micro * c.sharding.accumulation;
    }
  }
}

// Whether gradients go through reduce-scatters (else the optimizer reads what the backward wrote).
// Bytes one rank sends in its tensor-parallel group per micro-batch: each all-reduce of the split
// layers' edges (forward, backward, and again where recompute replays a forward one) and the
// vocabulary-parallel loss's two all-gathers (row maxima in fp32; sums and target logits in double).
int64_t tensor_traffic(const Graph& g, const Plan& plan, int size) {
  if (size == 1) return 0;
  int64_t bytes = 0;
  for (size_t index : plan.nodes) {
    const Node& node = g.nodes()[index];
    if (node.op == &ops::kReduceFromTensorGroup || node.op == &ops::kTensorGroupAllReduce)
      bytes += ops::all_reduce_bytes_sent(value_bytes(g.value(node.outputs[0])), size);
    if (node.op == &ops::kVocabCrossEntropy)
      bytes += int64_t(size - 1) * g.value(node.outputs[0]).shape.numel() * (4 + 16);
  }
  return bytes;
}

bool gradients_reduced(const ShardingSpec& spec) { return spec.world > 1 || spec.accumulation > 1 || spec.stage >= 2; }

}  // namespace

CompiledStep compile_step(const recipe::Recipe& r, int world, TensorLayout tensor, PipelineLayout pipeline) {
  if (world > 1 && r.precision.communication_dtype != r.precision.accumulation_dtype)
    throw UserError(
        "precision.communication_dtype differs from precision.accumulation_dtype: gradients are reduced in the "
        "type they accumulate in, so that every ZeRO stage and world size sums the same bits; set "
        "communication_dtype to the accumulation_dtype (or accumulation_dtype to the type to communicate in)");
  CompiledStep c;
  c.tensor = tensor;
  c.pipeline = pipeline;
  c.model = build_differentiated(r, world, tensor, pipeline, c.recompute, c.fusions);
  Graph& g = c.model.graph;
  c.sharding = ShardingSpec{world, 0, int(r.distributed.zero_stage), *r.train.gradient_accumulation_steps};
  const ShardLayout layout(g.units(), world, 0);
  const ZeroPlanSpec zero{int(r.distributed.zero_stage), gradients_reduced(c.sharding), r.distributed.bucket_size,
                          r.distributed.prefetch};
  // What the step reads after each plan: the losses, or a pipeline stage's activation for the next
  // stage and the gradient for the one before.
  std::vector<ValueId> kept;
  for (ValueId v : {c.model.losses, c.model.stage_output, c.model.stage_input_gradient})
    if (v != kNoValue) kept.push_back(v);
  c.train = plan_zero_step(g, layout, all_nodes(g), kept, zero, true);
  c.eval = plan_zero_step(g, layout, forward_nodes(g), kept, zero, false);
  c.eval.training = false;
  if (pipeline.stages > 1) {  // the evaluation plan with dropout on (no reductions: the backward makes them)
    c.forward = c.eval;
    c.forward.training = true;
  }
  c.traffic = plan_traffic(g, layout, c.sharding, c.train);
  c.traffic.tensor = tensor_traffic(g, c.train, tensor.size) * c.sharding.accumulation;
  // Per micro-batch, the activation on to the next stage and its gradient back to the one before.
  for (ValueId v : {c.model.stage_output, c.model.stage_input_gradient})
    if (v != kNoValue) c.traffic.pipeline += value_bytes(g.value(v)) * c.sharding.accumulation;
  // A tied embedding's fp32 gradient (this rank's range), all-reduced between the first and last stage.
  for (size_t u = 0; u < g.units().size(); ++u)
    if (pipeline.stages > 1 && g.units()[u].name.starts_with(kTiedUnitPrefix))
      c.traffic.pipeline += ParameterStore::range_size(layout, c.sharding, u) * 4;
  MemoryPlan& m = c.memory;
  c.offload = offload_spec(r, 0);
  const ParameterStore::Bytes store = ParameterStore::planned_bytes(g, c.sharding, c.offload);
  m.parameters = store.parameters + store.frozen;
  m.frozen = store.frozen;
  m.gradients = store.gradients;
  m.optimizer_state = optimizer_state_bytes(r.optimizer, store.optimizer_elements * 4);
  m.activations = std::max({c.train.arena_bytes, c.eval.arena_bytes, c.forward.arena_bytes});
  if (!c.train.actions.empty() || !c.eval.actions.empty()) {
    const int64_t without =
        std::max(plan_step(g, c.train.nodes, kept).arena_bytes, plan_step(g, c.eval.nodes, kept).arena_bytes);
    m.zero_buffers = std::max<int64_t>(0, m.activations - without);
  }
  for (const Value& v : g.values()) {
    if (v.placement == Placement::input) m.inputs += value_bytes(v);
    if (v.placement == Placement::host) m.host += value_bytes(v);
  }
  m.scratch = std::max({c.train.scratch_bytes, c.eval.scratch_bytes, c.forward.scratch_bytes});
  // A pipeline stage keeps each micro-batch's received activation until its backward, and the
  // activation it hands on until it is sent.
  if (c.model.stage_input != kNoValue)
    m.host += value_bytes(g.value(c.model.stage_input)) * *r.train.gradient_accumulation_steps;
  if (c.model.stage_output != kNoValue) m.host += value_bytes(g.value(c.model.stage_output));
  // An asynchronous checkpoint's snapshot (one rank's file); a synchronous one streams the state
  // (plan_offload: through a piece of the offloaded state).
  m.checkpoint_snapshot =
      r.checkpoint.async ? rank_file_bytes(g, world, size_t(1 + optimizer_state_tensors(r.optimizer))) : 0;
  // A host communicator receives every peer's chunk of a reduce-scatter before summing them in
  // rank order (dist/communicator.h): one buffer, as large as the largest unit's gradient.
  if (world > 1)
    for (size_t u = 0; u < layout.units(); ++u)
      m.staging = std::max(m.staging, layout.padded(u) * int64_t(dtype_size(g.grad_dtype())));
  for (size_t index : c.train.nodes) {
    const Node& node = g.nodes()[index];
    if (node.op->flops) c.flops_per_micro_batch += node.op->flops(g, node);
    // Forward, input gradient and weight gradient; a frozen weight has no gradient to compute.
    if (!node.backward && is_matmul(*node.op))
      c.model_flops_per_micro_batch += (reads_frozen_weight(g, node) ? 2 : 3) * node.op->flops(g, node);
  }
  plan_offload(r, g, layout, c);
  if (planned_for_cuda(r)) {
    m.on_device = m.activations + m.scratch;
    m.pinned = 2 * m.inputs + m.host + (device_resident(r) ? 0 : staged_mirror_bytes(g, {&c.train, &c.eval}));
  }
  return c;
}

int64_t staged_mirror_bytes(const Graph& g, const std::vector<const Plan*>& plans) {
  using Kind = StepAction::Kind;
  MirrorPool pool;
  std::map<int, ValueId> reducing;  // unit -> the buffer its reduce-scatter's mirror holds
  // The pool persists across runs: the training plan, the evaluation plan, then training again.
  for (int round = 0; round < 2; ++round)
    for (const Plan* plan : plans)
      for (const auto& list : plan->actions)
        for (const StepAction& a : list) {
          if (a.kind == Kind::gather) pool.acquire(a.buffer, value_bytes(g.value(a.buffer)));
          if (a.kind == Kind::use_params) pool.release(a.buffer);
          if (a.kind == Kind::reduce && a.buffer != kNoValue) {
            pool.acquire(a.buffer, value_bytes(g.value(a.buffer)));
            reducing[a.unit] = a.buffer;
          }
          if (a.kind == Kind::wait)
            if (auto found = reducing.find(a.unit); found != reducing.end()) {
              pool.release(found->second);
              reducing.erase(found);
            }
        }
  return pool.bytes();
}

bool is_matmul(const OpDef& op) { return op.matmul; }

bool reads_frozen_weight(const Graph& g, const Node& node) {
  for (ValueId in : node.inputs)
    if (g.value(in).placement == Placement::frozen) return true;
  return false;
}

void check_memory_available(const MemoryPlan& memory, int local_ranks) {
  const MemoryLimit limit = memory_limit();
  const int64_t needed = host_bytes_needed(memory, local_ranks);
  if (!limit.known() || needed <= limit.bytes) return;
  // Every line of the plan that holds memory, so the message says what to shrink.
  std::string lines;
  auto line = [&](const char* what, int64_t bytes) {
    if (bytes > 0) lines += std::string(lines.empty() ? "" : ", ") + what + " " + format_bytes(bytes);
  };
  line("parameters", memory.parameters);
  line("gradients", memory.gradients);
  line("optimizer state", memory.optimizer_state);
  if (!memory.on_device) {  // a GPU run's are the device's
    line("activations", memory.activations);
    line("fp32 scratch", memory.scratch);
  }
  line("inputs", memory.inputs);
  line("page-locked staging", memory.pinned);
  line("host activations", memory.host);
  line("reduce staging", memory.staging);
  line("offload buffers", memory.offload_buffers);
  line("checkpoint snapshot", memory.checkpoint_snapshot);
  const int64_t per_rank = host_bytes_needed(memory, 1);
  throw MemoryShortfall(
      "the plan needs " + format_bytes(per_rank) + " per rank (" + lines + ")" +
          (local_ranks > 1
               ? ", " + format_bytes(needed) + " for the " + std::to_string(local_ranks) + " ranks on this machine"
               : "") +
          ", but the limit in force is " + limit.describe() + ": " + format_bytes(needed - limit.bytes) + " short",
      limit.bytes);
}

OffloadSpec offload_spec(const recipe::Recipe& r, int rank) {
  OffloadSpec spec;
  spec.optimizer = r.offload.optimizer;
  spec.parameters = r.offload.parameters;
  spec.directory = r.offload.nvme_path;
  char stem[32];
  std::snprintf(stem, sizeof stem, ".rank-%05d", rank);
  spec.file_stem = r.run.name + stem;
  spec.queue_depth = int(r.offload.queue_depth);
  spec.block_size = r.offload.block_size;
  spec.chunk_size = r.offload.chunk_size;
  return spec;
}

Session::Session(const recipe::Recipe& r) : Session(r, compile_step(r)) {}

namespace {

ShardingSpec rank_sharding(ShardingSpec spec, const Communicator& comm) {
  ENGINE_CHECK(spec.world == comm.size(), "the step was compiled for world size " + std::to_string(spec.world) +
                                              ", the communicator has " + std::to_string(comm.size()) + " ranks");
  spec.rank = comm.rank();
  return spec;
}

std::unique_ptr<OffloadedState> make_offloaded_state(const recipe::Recipe& r, const Graph& g, const OffloadSpec& spec,
                                                     const ShardingSpec& sharding) {
  if (!spec.any()) return nullptr;
  if (spec.optimizer == OffloadTier::nvme || spec.parameters == OffloadTier::nvme) {
    // The swap files' directory is made when missing, as DeepSpeed makes its nvme_path.
    std::error_code error;
    std::filesystem::create_directories(spec.directory, error);
    if (error)
      throw UserError("offload.nvme_path " + spec.directory.string() +
                      ": cannot create the directory: " + error.message());
  }
  const ShardLayout layout(g.units(), sharding.world, sharding.rank);
  std::vector<int64_t> ranges;
  for (size_t u = 0; u < layout.units(); ++u) ranges.push_back(ParameterStore::range_size(layout, sharding, u));
  std::vector<std::string> kinds;
  if (spec.optimizer != OffloadTier::none)
    kinds = offloaded_kinds(r.optimizer, spec.masters_offloaded(g.param_dtype(), sharding.stage));
  const bool shard = sharding.stage == 3 && spec.parameters != OffloadTier::none;
  return std::make_unique<OffloadedState>(spec, ranges, kinds, g.param_dtype(), shard);
}

}  // namespace

Session::Session(const recipe::Recipe& r, CompiledStep compiled, Communicator* communicator, Communicator* tensor_comm,
                 const PipelineLinks* pipeline_links)
    : recipe(r),
      own_comm(communicator ? nullptr : make_local_communicator()),
      comm(communicator ? *communicator : *own_comm),
      rank(comm.rank()),
      world(comm.size()),
      data(make_dataset(r)),
      model(std::move(compiled.model)),
      // Swap files are named by the world rank: the ranks of a tensor-parallel group or of a
      // pipeline's stages share their data-parallel rank.
      offload(offload_spec(r, (rank * compiled.pipeline.stages + compiled.pipeline.stage) * compiled.tensor.size +
                                  compiled.tensor.rank)),
      offloaded(make_offloaded_state(r, model.graph, offload, rank_sharding(compiled.sharding, comm))),
      store(model.graph, rank_sharding(compiled.sharding, comm), offload, offloaded.get()),
      optimizer(offload.optimizer != OffloadTier::none ? make_offloaded_optimizer(r.optimizer, store, *offloaded)
                                                       : make_optimizer(r.optimizer, store)),
      device(resolve_device(r, comm.local_rank())),
      executor(model.graph, store, uint64_t(r.run.seed), device),
      zero(store, comm, r.distributed.prefetch),
      micro_batch(*r.train.micro_batch_size),
      accumulation(*r.train.gradient_accumulation_steps),
      scaler(r.precision),
      tensor_layout(compiled.tensor),
      memory_(compiled.memory) {
  train_gathers_ = gather_sequence(compiled.train);
  eval_gathers_ = gather_sequence(compiled.eval);
  executor.add_plan("train", std::move(compiled.train));
  executor.add_plan("eval", std::move(compiled.eval));
  if (compiled.pipeline.stages > 1) {
    ENGINE_CHECK(pipeline_links && pipeline_links->stages == compiled.pipeline.stages &&
                     pipeline_links->stage == compiled.pipeline.stage,
                 "a pipeline stage needs its links to the other stages");
    if (device.kind != Device::Kind::cpu)
      throw UserError("distributed.pipeline_parallel " + std::to_string(compiled.pipeline.stages) +
                      " runs on the CPU for now, and run.device resolved to " + describe_device(device) +
                      ": set run.device: cpu");
    pipeline = *pipeline_links;
    forward_gathers_ = gather_sequence(compiled.forward);
    executor.add_plan("forward", std::move(compiled.forward));
    // The last stage's weights that the first holds too (a tied embedding) count once in the norm.
    std::vector<bool> counted;
    for (const Unit& unit : model.graph.units())
      counted.push_back(
          !(pipeline.stage == pipeline.stages - 1 && unit.name.starts_with(kTiedUnitPrefix) && pipeline.embedding));
    zero.set_pipeline_group(pipeline.group, std::move(counted));
    if (model.stage_input != kNoValue)
      held_inputs_.assign(size_t(accumulation),
                          std::vector<float>(static_cast<size_t>(model.graph.value(model.stage_input).shape.numel())));
    if (model.stage_output != kNoValue)
      handed_on_.resize(static_cast<size_t>(model.graph.value(model.stage_output).shape.numel()));
  }
  if (tensor_layout.size > 1) {
    ENGINE_CHECK(tensor_comm && tensor_comm->size() == tensor_layout.size && tensor_comm->rank() == tensor_layout.rank,
                 "a tensor-parallel step needs its group's communicator");
    if (device.kind != Device::Kind::cpu)
      throw UserError("distributed.tensor_parallel " + std::to_string(tensor_layout.size) +
                      " runs on the CPU for now, and run.device resolved to " + describe_device(device) +
                      ": set run.device: cpu");
    tensor_group = std::make_unique<TensorGroup>(*tensor_comm);
    executor.set_tensor_group(tensor_group.get());
    zero.set_tensor_group(tensor_comm);
  }
  DeviceRunner* runner = executor.runner();
  std::string staged;
  if (runner && !device_resident(r, &staged))
    device_note = "run.device cuda with " + staged +
                  ": the step computes on the GPU; gradient reductions, the update and ZeRO's gathers run on the "
                  "host, through page-locked staging";
  else if (runner) {
    // Without offload: the whole update happens on the device, and the model state (stages 1-3 on
    // several ranks: this rank's shard of it) stays there between steps; several ranks reduce their
    // gradients there too, and ZeRO-2/3's plans gather and reduce-scatter on the device.
    std::string how;
    device_collectives = make_device_collectives(r, comm, device, &how);
    const int stage = r.distributed.zero_stage;
    if (device_collectives || stage >= 2)
      device_note = "run.device cuda with " + std::to_string(world) + (world == 1 ? " rank" : " ranks") +
                    " at zero_stage " + std::to_string(stage) + ": the step and the update on each GPU, " +
                    (device_collectives ? "the gradients reduced on the device through " + how
                                        : std::string("the micro-batches summed on the device")) +
                    (stage == 3   ? ", each unit gathered and reduce-scattered where the plan places it"
                     : stage == 2 ? ", each unit reduce-scattered where the plan places it"
                                  : "");
    device_optimizer =
        make_device_optimizer(r.optimizer, store, *optimizer, *runner, accumulation, device_collectives.get());
    runner->set_resident(true, device_optimizer->plan_actions());
    runner->use_graphs(r.run.cuda_graphs);
    device_optimizer->use_graphs(r.run.cuda_graphs);
  }
}

void Session::ensure_device_current() {
  if (!device_optimizer || device_current_) return;
  ENGINE_CHECK(host_current_, "the host's model state changed while the device held newer state");
  device_optimizer->upload();
  device_current_ = true;
}

void Session::initialize(uint64_t seed) {
  store.initialize(seed, true);
  zero.gather_drawn_shards();
}

void Session::host_changed() {
  device_current_ = false;
  host_current_ = true;  // what was written is the state now, whatever the device held
  if (DeviceRunner* runner = executor.runner()) runner->parameters_changed();  // a staged run uploads them anew
}

void Session::sync_host() {
  if (!device_optimizer || host_current_) return;
  device_optimizer->download();
  host_current_ = true;
}

void Session::load_batch(const Batch& batch) {
  // A pipeline stage reads the inputs its layers read (the tokens first, the targets last).
  if (model.inputs != kNoValue) {
    if (!batch.tokens.empty())
      std::memcpy(executor.input(model.inputs), batch.tokens.data(), batch.tokens.size() * 4);
    else
      std::memcpy(executor.input(model.inputs), batch.inputs.data(), batch.inputs.size() * 4);
  }
  if (model.targets != kNoValue)
    std::memcpy(executor.input(model.targets), batch.targets.data(), batch.targets.size() * 4);
  if (model.positions != kNoValue) {
    ENGINE_CHECK(batch.positions.size() == batch.tokens.size(), "packed documents without their positions");
    std::memcpy(executor.input(model.positions), batch.positions.data(), batch.positions.size() * 4);
  }
  // On a GPU the copy starts now, while the previous step's update may still be running.
  executor.stage_inputs();
}

double Session::batch_loss(const std::string& plan) {
  if (model.losses == kNoValue) return 0;  // a pipeline stage before the last
  // The stream may wait on the device collectives: the host waits for them first, within the timeout.
  if (device_optimizer) device_optimizer->wait_for_collectives();
  return mean_of_rows(executor.value_f32(plan, model.losses));
}

double Session::mean_of_rows(const float* losses) const {
  const int64_t rows = model.graph.value(model.losses).shape.numel();
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i) sum += losses[i];
  return sum / double(rows);
}

double Session::train_micro_batch(const Batch& batch, int64_t step, int64_t micro, double loss_scale) {
  ensure_device_current();
  {
    trace::Scope event("data", "load batch");
    if (store.sharding().stage < 2 && !device_optimizer) store.zero_micro_grads();
    load_batch(batch);
    zero.begin_micro_batch(micro);
    zero.begin_pass(train_gathers_);
    if (device_optimizer) device_optimizer->begin_micro_batch(micro);
  }
  // Dropout draws from the global micro-batch index, so every world size draws the same masks.
  executor.run("train", uint64_t(step), uint64_t(micro * world + rank), float(loss_scale), &zero);
  // The loss is copied behind the run (or read: the host waits for the run, and for the reductions
  // its plan waits on), before the reductions that follow the run (optim/device_optimizer.h) are
  // enqueued.
  double loss = std::numeric_limits<double>::quiet_NaN();
  if (reads_deferred_)  // read at the step's end (finish_step_on_device)
    executor.runner()->keep_value("train", executor.plan("train"), model.losses, int(micro));
  else
    loss = batch_loss("train");
  if (device_optimizer) device_optimizer->add_micro_batch(micro);
  return loss;
}

Session::StepResult Session::finish_step_on_device(std::vector<double>& losses, double loss_factor, double scale) {
  const auto start = std::chrono::steady_clock::now();
  StepResult result;
  result.loss_scale = scale;
  result.lr = learning_rate(recipe, updates);
  DeviceOptimizer::StepEnd end;
  {
    trace::Scope event("optimizer", "gradient norm and update on the device");
    end = device_optimizer->finish_and_step(result.lr, step_policy(scale));
  }
  for (size_t micro = 0; micro < losses.size(); ++micro)
    losses[micro] = mean_of_rows(executor.runner()->kept_f32(int(micro))) * loss_factor;
  result.loss = zero.mean_loss(losses);
  // The host adds the same partial sums in the same order (and keeps the units' norms for the
  // telemetry): a device that decided from another norm is a bug, not a rounding.
  const double host_norm = zero.whole_gradient_norm(end.partials);
  const double device_norm = end.decision.scaled_norm;
  if (!(host_norm == device_norm || (std::isnan(host_norm) && std::isnan(device_norm))))
    throw InternalError("the device decided the update from the gradient norm " + std::to_string(device_norm) +
                        ", the host sums its partial sums to " + std::to_string(host_norm));
  result.grad_norm = end.decision.grad_norm;
  if (end.decision.skip) {
    result = skip_overflowed_step(result);
  } else {
    host_current_ = false;
    scaler.update(false);
    ++updates;
  }
  device_update_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

StepPolicy Session::step_policy(double scale) const {
  return StepPolicy{
      .loss_scale = scale, .max_norm = recipe.train.gradient_clipping, .skip_non_finite = scaler.enabled() ? 1 : 0};
}

Session::StepResult Session::skip_overflowed_step(StepResult result) {
  result.overflow = result.skipped = true;
  if (scaler.update(true) == LossScaler::Outcome::min_scale) {
    if (recipe.precision.on_min_scale == recipe::MinScaleAction::abort)
      throw UserError("fp16 gradients still overflow at the minimum loss scale " + std::to_string(result.loss_scale) +
                      " (" + std::to_string(scaler.skipped()) +
                      " steps skipped so far); train in bf16 (precision.mode: bf16 has fp32's range), lower "
                      "precision.min_scale, or set precision.on_min_scale: fallback");
    fall_back_to_bf16();
    result.fell_back = true;
  }
  return result;
}

Session::StepResult Session::finish_step(double loss, double scale, const StepHooks& hooks) {
  if (!device_optimizer) return finish_step_on_host(loss, scale, hooks);
  const auto start = std::chrono::steady_clock::now();
  StepResult result = finish_step_on_host(loss, scale, hooks);
  device_update_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Session::StepResult Session::finish_step_on_host(double loss, double scale, const StepHooks& hooks) {
  if (offloaded) offloaded->check_present();  // a deleted swap file stops the run before its reads go wrong
  std::vector<double> device_partials;
  {
    trace::Scope event("communication", "finish gradient reductions");
    if (!device_optimizer) zero.finish_gradients();
    sync_tied_gradients();
  }
  if (hooks.after_backward) {
    if (device_optimizer) device_optimizer->download_gradients();
    hooks.after_backward();
    if (device_optimizer) device_optimizer->upload_gradients();  // the hook may have changed them
  }
  // The norm of the gradients the update reads: after the hook, as on the CPU.
  if (device_optimizer) device_partials = device_optimizer->finish_gradients();
  // Three flat events on the trace's step lane: the norm, the update (clipping included), the copies.
  std::optional<trace::Scope> event(std::in_place, "optimizer", "gradient norm");
  StepResult result;
  result.loss = loss;
  result.loss_scale = scale;
  result.lr = learning_rate(recipe, updates);
  const double scaled_norm = device_optimizer ? zero.whole_gradient_norm(device_partials) : zero.gradient_norm();
  event.reset();
  event.emplace("optimizer", "optimizer update");
  const UpdateDecision decision = decide_update(scaled_norm, step_policy(scale));
  result.grad_norm = decision.grad_norm;
  if (decision.skip) return skip_overflowed_step(result);
  const double factor = decision.factor;
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
  if (device_optimizer) {
    device_optimizer->step(result.lr, factor);  // and the 16-bit copies
    host_current_ = false;
  } else {
    if (factor != 1.0) scale_gradients(store, factor);
    optimizer->step(result.lr);
    event.reset();
    event.emplace("optimizer", "parameter copies");
    zero.finish_update(!optimizer->writes_copies());
    if (DeviceRunner* runner = executor.runner()) runner->parameters_changed();  // staged: the next run uploads them
  }
  scaler.update(false);
  ++updates;
  return result;
}

void Session::fall_back_to_bf16() {
  sync_host();  // the host's masters are rounded anew, and the device takes them from there
  host_changed();
  for (size_t i = 0; i < model.graph.values().size(); ++i)
    if (model.graph.values()[i].dtype == DType::f16) model.graph.mutable_value(ValueId(i)).dtype = DType::bf16;
  executor.values_retyped();  // the graphs' kernels read f16, cuDNN's bf16 plans may want more workspace
  if (device_optimizer) device_optimizer->reset_graphs();
  store.retype(DType::f16, DType::bf16);  // rounds this rank's masters anew ...
  zero.gather_parameters();               // ... and the other ranks' slices arrive (every rank falls back)
  scaler.disable();
}

int64_t Session::trained_targets(const Batch& batch) {
  return std::count_if(batch.targets.begin(), batch.targets.end(), [](int32_t t) { return t != ops::kIgnoredTarget; });
}

double Session::trained_normalization(int64_t trained) {
  double total = 0;
  for (double count : zero.gather({double(trained)}, "the step's trained tokens")) total += count;
  const double positions = double(micro_batch * model.sequence * accumulation * world);
  return total > 0 ? positions / total : 0.0;
}

double Session::evaluate(int64_t batches) {
  // Rank r evaluates batches r, r + world, ...; every rank runs as many (stage 3 gathers in each),
  // and the losses are summed in batch order, as one rank would.
  trace::Scope event("other", "evaluation");
  ensure_device_current();
  trace::Suspend one_event;  // its ops are not the step's
  const int64_t rounds = (batches + world - 1) / world;
  const bool masked = data->ignores_targets();
  std::vector<double> mine;  // per round: the batch's mean loss, or with a mask its loss sum and trained count
  Batch batch(micro_batch, model.sequence, data->features());
  for (int64_t k = 0; k < rounds; ++k) {
    data->fill(Split::validation, std::min(k * world + rank, batches - 1), batch);
    if (pipeline.stages > 1) {
      pipeline_forward(0, 0, batch, 1.0, "eval");  // through every stage; the last has the loss
    } else {
      load_batch(batch);
      zero.begin_pass(eval_gathers_);
      executor.run("eval", 0, 0, 1.0f, &zero);
    }
    const double mean = batch_loss("eval");
    if (masked) {
      mine.push_back(mean * double(batch.targets.size()));
      mine.push_back(double(trained_targets(batch)));
    } else {
      mine.push_back(mean);
    }
  }
  const std::vector<double> all = zero.gather(mine, "validation losses");
  if (masked) {  // the batches' loss sums over their trained tokens
    double sum = 0, count = 0;
    for (int64_t i = 0; i < batches; ++i) {
      const size_t at = size_t((i % world) * rounds + i / world) * 2;
      sum += all[at];
      count += all[at + 1];
    }
    return last_stage_value(count > 0 ? sum / count : 0.0);
  }
  double total = 0;
  for (int64_t i = 0; i < batches; ++i) total += all[size_t((i % world) * rounds + i / world)];
  return last_stage_value(total / double(batches));
}

}  // namespace engine
