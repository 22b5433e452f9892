#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <tuple>

#include "cli/commands.h"
#include "core/error.h"
#include "core/memory_limit.h"
#include "dist/communicator.h"

#include <spdlog/spdlog.h>
#include "core/device_info.h"
#include "graph/precision.h"
#include "recipe/rules.h"
#include "telemetry/roofline.h"
#include "trainer/device.h"
#include "trainer/fit.h"
#include "trainer/progress_line.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine::cli {

using namespace engine::recipe;

namespace {

int exit_status_of(const std::exception& e) {
  if (dynamic_cast<const CommunicationError*>(&e)) return kExitRankLost;
  return dynamic_cast<const UserError*>(&e) ? kExitUser : kExitInternal;
}

// "bench/gpt-bench.yaml train.steps=2": the recipe and overrides as given, for hints to rerun them.
std::string recipe_command(const RecipeArgs& args) {
  std::string text = args.recipe.string();
  for (const std::string& o : args.overrides) text += " " + o;
  if (args.world_size > 0) text += " --world-size " + std::to_string(args.world_size);
  return text;
}

// engine::train, with memory failures as user errors that name this recipe in their hint.
TrainSummary train_naming_memory(const LoadedRecipe& loaded, const RecipeArgs& args, const TrainOptions& options) {
  try {
    return engine::train(loaded, std::cout, options);
  } catch (const MemoryShortfall& e) {
    throw UserError(e.with_recipe(recipe_command(args)));
  } catch (const std::bad_alloc&) {
    throw UserError(out_of_memory_message(recipe_command(args)));
  }
}

}  // namespace

int train(const RecipeArgs& args) {
  const LoadOptions load_options = args.load_options();
  TrainOptions options;
  options.first_gradients = args.first_gradients;
  // One file per step: a second file for the same step would silently replace the first.
  for (const auto& [step, path] : args.gradients_at)
    if (auto [it, inserted] = options.gradients_at.emplace(step, path); !inserted)
      throw UserError("--dump-gradients-at " + std::to_string(step) + " is given twice (" + it->second.string() +
                      " and " + path + "): list each step once");
  LoadedRecipe loaded = load_recipe(args.recipe, load_options);
  std::unique_ptr<Communicator> comm = make_communicator({loaded.recipe.distributed.timeout});
  if (comm->size() != loaded.world.size)
    throw UserError("world size " + std::to_string(loaded.world.size) + " (from " + loaded.world.source +
                    ") but this process is one of " + std::to_string(comm->size()) +
                    "; start the ranks with a launcher, e.g. `mpirun -n " + std::to_string(loaded.world.size) +
                    " engine train " + args.recipe.string() + "` (--world-size is for `engine plan`)");
  options.comm = comm.get();
  options.resume = args.resume;
  options.stop_after = args.stop_after;
  if (comm->rank() == 0) std::cout << summary(loaded) << "\n";
  if (comm->size() == 1) return train_naming_memory(loaded, args, options).preempted ? kExitRequeue : kExitOk;
  try {
    if (train_naming_memory(loaded, args, options).preempted) return kExitRequeue;
  } catch (const std::exception& e) {
    // The other ranks may be waiting in a collective this rank will never join: end the job.
    const int status = exit_status_of(e);
    spdlog::error("{}{}", status == kExitInternal ? "internal error: " : "", e.what());
    spdlog::default_logger()->flush();
    comm->abort_job(status);
  }
  return kExitOk;
}

namespace {

// Per rank, for every ZeRO stage at the recipe's world size, next to the ZeRO paper's model states
// (mixed-precision Adam: 2 bytes of parameters, 2 of gradients, K = 12 of fp32 masters and moments
// per parameter, divided as each stage divides them).
void print_stage_table(const Recipe& r, int world, int64_t parameters) {
  const double psi = double(parameters), n = double(world);
  const double paper[4] = {16 * psi, 4 * psi + 12 * psi / n, 2 * psi + 14 * psi / n, 16 * psi / n};
  std::printf(
      "\nZeRO stages per rank at world size %d (model states = parameters + gradients + optimizer state;\n"
      "the paper's column is 2Ψ + 2Ψ + 12Ψ divided as the stage divides it, Ψ = %lld):\n",
      world, (long long)parameters);
  std::printf("  stage  %11s %11s %11s %12s %11s %11s %11s %11s %11s\n", "parameters", "gradients", "optimizer",
              "model states", "paper", "ZeRO bufs", "activations", "total", "sent/step");
  for (int stage = 0; stage <= 3; ++stage) {
    Recipe variant = r;
    variant.distributed.zero_stage = stage;
    const CompiledStep c = compile_step(variant, world, {int(r.distributed.tensor_parallel), 0},
                                        {int(r.distributed.pipeline_parallel), 0});
    const MemoryPlan& m = c.memory;
    std::printf("  %s%d    %11s %11s %11s %12s %11s %11s %11s %11s %11s\n",
                stage == r.distributed.zero_stage ? "*" : " ", stage, format_bytes(m.parameters).c_str(),
                format_bytes(m.gradients).c_str(), format_bytes(m.optimizer_state).c_str(),
                format_bytes(m.model_states()).c_str(), format_bytes(int64_t(paper[stage])).c_str(),
                format_bytes(m.zero_buffers).c_str(), format_bytes(m.host_activations()).c_str(),
                format_bytes(m.total()).c_str(), format_bytes(c.traffic.total()).c_str());
  }
  std::printf("  (* the recipe's stage; sent/step: bytes each rank sends in one optimizer step%s)\n",
              planned_for_cuda(r) ? "; activations, total: the host's" : "");
}

// Every layout of `ranks` as tensor-parallel T x pipeline stages P x data-parallel D that the model
// splits into (trainer/fit.h model_layouts), with the heavier end stage's memory (the first stage
// holds every micro-batch's input in flight, the last the head) and bytes sent.
void print_layouts(const Recipe& r, int ranks) {
  if (ranks == 1 || r.model.arch == Arch::mlp) return;
  std::printf("\nlayouts of %d ranks (T x P x D, ZeRO stage %lld over D; per rank, the heavier end stage's):\n", ranks,
              (long long)r.distributed.zero_stage);
  std::printf("  T x P x D     %11s %11s %11s %15s %11s\n", "parameters", "activations", "total", "sent (T or P)",
              "sent/step");
  for (const auto& [t, p] : model_layouts(r, ranks)) {
    Recipe variant = r;
    variant.distributed.tensor_parallel = t;
    variant.distributed.pipeline_parallel = p;
    CompiledStep heaviest = compile_step(variant, ranks / (t * p), {t, 0}, {p, 0});
    if (p > 1) {
      CompiledStep last = compile_step(variant, ranks / (t * p), {t, 0}, {p, p - 1});
      if (last.memory.total() > heaviest.memory.total()) heaviest = std::move(last);
    }
    const bool recipes = t == r.distributed.tensor_parallel && p == r.distributed.pipeline_parallel;
    std::printf("  %s%2d x %d x %-3d %11s %11s %11s %15s %11s\n", recipes ? "*" : " ", t, p, ranks / (t * p),
                format_bytes(heaviest.memory.parameters).c_str(), format_bytes(heaviest.memory.activations).c_str(),
                format_bytes(heaviest.memory.total()).c_str(),
                format_bytes(heaviest.traffic.tensor + heaviest.traffic.pipeline).c_str(),
                format_bytes(heaviest.traffic.total()).c_str());
  }
  std::printf("  (* the recipe's layout: distributed.tensor_parallel, distributed.pipeline_parallel)\n");
}

// With pipeline stages: each stage's units, parameters, FLOPs and memory (the plan above is stage 0's).
void print_pipeline_stages(const Recipe& r, int world) {
  const int stages = int(r.distributed.pipeline_parallel);
  if (stages == 1) return;
  std::printf("\npipeline stages (%s schedule, %lld micro-batches per step; the plan above is stage 0's):\n",
              r.distributed.pipeline_schedule == PipelineSchedule::gpipe ? "GPipe" : "1F1B",
              (long long)*r.train.gradient_accumulation_steps);
  std::printf("  stage  %-24s %12s %14s %11s %11s\n", "units", "parameters", "FLOPs/micro", "total", "sent/step");
  for (int stage = 0; stage < stages; ++stage) {
    const CompiledStep c = compile_step(r, world, {int(r.distributed.tensor_parallel), 0}, {stages, stage});
    const std::vector<Unit>& units = c.model.graph.units();
    const std::string span = units.front().name + (units.size() > 1 ? " .. " + units.back().name : "");
    std::printf("  %5d  %-24s %12lld %14.4g %11s %11s\n", stage, span.c_str(), (long long)c.model.graph.param_count(),
                c.flops_per_micro_batch, format_bytes(c.memory.total()).c_str(),
                format_bytes(c.traffic.total()).c_str());
  }
}

}  // namespace

namespace {

// Per op, what one optimizer step asks of the machine and the least time that takes at its roofs:
// where the step's time must go even with perfect kernels (the op table shows where it does go).
void print_roofline(const CompiledStep& session, const Recipe& r) {
  const Graph& g = session.model.graph;
  const MachineLimits limits = machine_limits(compute_dtype(r), omp_get_max_threads());
  struct Row {
    double flops = 0, bytes = 0;
  };
  std::map<std::string, Row> rows;
  for (size_t index : session.train.nodes) {
    const NodeWork work = node_work(g, g.nodes()[index]);
    Row& row = rows[g.nodes()[index].op->name];
    row.flops += work.flops;
    row.bytes += work.bytes;
  }
  const auto per_step = double(session.sharding.accumulation);
  std::vector<std::pair<RooflinePoint, std::string>> order;
  double total = 0;
  for (auto& [name, row] : rows) {
    row.flops *= per_step;
    row.bytes *= per_step;
    order.emplace_back(roofline(row.flops, row.bytes, 0, limits), name);
    total += order.back().first.bound_seconds;
  }
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {  // slowest first
    return std::tie(a.first.bound_seconds, a.second) > std::tie(b.first.bound_seconds, b.second);
  });
  std::cout << "\nroofline per optimizer step (this machine: " << limits.describe()
            << "; telemetry.op_table measures the same ops):\n";
  std::printf("  %-28s %12s %12s %8s %12s %7s\n", "op", "GFLOP", "MB moved", "bound", "time at roof", "share");
  for (const auto& [point, name] : order) {
    const Row& row = rows[name];
    std::printf("  %-28s %12.3f %12.1f %8s %10.2f ms %6.1f%%\n", name.c_str(), row.flops / 1e9, row.bytes / 1e6,
                point.memory_bound ? "memory" : "compute", point.bound_seconds * 1e3,
                total > 0 ? 100 * point.bound_seconds / total : 0.0);
  }
  std::printf("  %-28s %12s %12s %8s %10.2f ms\n", "total", "", "", "", total * 1e3);
}

}  // namespace

int plan(const RecipeArgs& args, const FitArgs& fit) {
  LoadedRecipe loaded = load_recipe(args.recipe, args.load_options());
  if (fit.fit) {  // the table and the proposal, without the plan's details
    std::cout << summary(loaded) << "\n";
    print_fit(args, fit, loaded);
    return kExitOk;
  }
  const Recipe& r = loaded.recipe;
  // The data-parallel ranks (the world, without tensor parallelism); the plan is tensor rank 0's.
  // Without a world size given, one data-parallel rank of distributed.tensor_parallel ranks.
  const int tensor = int(r.distributed.tensor_parallel), stages = int(r.distributed.pipeline_parallel);
  const int world = std::max(1, int(loaded.world.size) / (tensor * stages));
  // Sizes and FLOPs only: nothing is allocated. With pipeline stages, the first stage's plan.
  CompiledStep session = compile_step(r, world, {tensor, 0}, {stages, 0});
  const Graph& g = session.model.graph;
  std::cout << summary(loaded) << "\n\nparameters by wrap unit:\n";
  for (const Unit& unit : g.units()) std::printf("  %-14s %12lld\n", unit.name.c_str(), (long long)unit.numel);
  std::printf("  %-14s %12lld\n", "total", (long long)g.param_count());
  if (!g.frozen().empty())
    std::printf("  %-14s %12lld  (LoRA's base model: no gradients, no optimizer state)\n", "frozen",
                (long long)g.frozen_count());

  const int64_t accumulation = *r.train.gradient_accumulation_steps;
  const int64_t tokens_per_micro = session.model.batch * session.model.sequence;
  const double flops_micro = session.flops_per_micro_batch;
  std::cout << "\nFLOPs (forward + backward, counted from the graph's " << session.train.nodes.size() << " nodes):\n";
  std::printf("  per token        %.4g\n", flops_micro / double(tokens_per_micro));
  std::printf("  per step         %.4g  (%lld micro-batches of %lld tokens)\n", flops_micro * double(accumulation),
              (long long)accumulation, (long long)tokens_per_micro);
  if (r.model.arch != Arch::mlp) {
    // Kaplan et al. / PaLM: 6N per token for the weights (N excludes position embeddings) plus
    // 6 L T C for attention scores and values (3 x the forward's 2 L T C, causal mask ignored).
    // Frozen weights (LoRA's base) cost 4 per token: no weight gradient.
    double trained = double(g.param_count()), frozen = double(g.frozen_count());
    if (r.model.arch == Arch::gpt) (frozen > 0 ? frozen : trained) -= double(r.model.context_length * r.model.n_embd);
    double reference =
        6 * trained + 4 * frozen + 6.0 * double(r.model.n_layer * session.model.sequence * r.model.n_embd);
    std::printf("  reference        %.4g per token  (6N + 6 L T C%s)\n", reference,
                frozen > 0 ? "; 4N for frozen weights" : "");
  }
  const RecomputeReport& rc = session.recompute;
  if (r.activation_checkpointing.policy != CheckpointPolicy::none)
    std::printf("  recompute        %.4g per step (+%.1f%%): %lld forward nodes rerun in %d segments\n",
                rc.extra_flops * double(accumulation), 100 * rc.extra_flops / (flops_micro - rc.extra_flops),
                (long long)rc.cloned_nodes, rc.segments);
  if (session.fusions.total() > 0)
    std::printf(
        "  fused            %d products with the GELU after them, %d input gradients with GELU's backward, "
        "%d gradient copies into the norm backward that adds to them, %d residual adds into the norm after "
        "them, %d bias gradients into the norm backward that writes their output gradient (run.fusions)\n",
        session.fusions.gelu.forward, session.fusions.gelu.backward, session.fusions.gradient_copies,
        session.fusions.residual_norms, session.fusions.bias_gradients);
  if (session.fusions.unordered_attention > 0)
    std::printf(
        "  nondeterministic %d attention backwards may sum their query gradients in any order on cuDNN "
        "(run.deterministic: false): the same values within rounding, not the same bits at every run\n",
        session.fusions.unordered_attention);

  std::cout << "\nprecision (" << dtype_name(compute_dtype(r)) << "; master weights and optimizer state fp32):\n"
            << "  op                         nodes  stores    computes\n"
            << precision_table(g, session.train.nodes);
  print_roofline(session, r);

  MemoryPlan m = session.memory;
  std::cout << "\nmemory per rank (exact, from the plan; ZeRO stage " << r.distributed.zero_stage << ", world size "
            << world << "):\n";
  auto row = [](const char* what, int64_t bytes) {
    std::printf("  %-18s %12lld  %s\n", what, (long long)bytes, format_bytes(bytes).c_str());
  };
  row("parameters", m.parameters);
  if (m.frozen) row("  of which frozen", m.frozen);
  row("gradients", m.gradients);
  row("optimizer state", m.optimizer_state);
  row("activation peak", m.activations);
  row("inputs", m.inputs);
  if (m.zero_buffers) row("  of which ZeRO buffers", m.zero_buffers);
  if (m.scratch) row("fp32 scratch", m.scratch);
  if (m.on_device) row("held by the GPU", m.on_device);
  if (m.pinned) row("page-locked", m.pinned);
  if (m.host) row("host activations", m.host);
  if (m.staging) row("reduce staging", m.staging);
  if (m.offload_buffers) row("offload buffers", m.offload_buffers);
  row("total", m.total());
  row("checkpoint snapshot", m.checkpoint_snapshot);
  const Plan& train_plan = session.train;
  std::printf(
      "  (activations without reuse would take %s; the checkpoint snapshot is this rank's checkpoint file,\n"
      "   held only while a checkpoint is written)\n",
      format_bytes(train_plan.unplaced_bytes).c_str());
  if (m.on_device)
    std::printf(
        "  (the total is host memory: on a GPU the activation peak and the fp32 scratch are the device's, in its plan\n"
        "   below; the host holds page-locked staging: the inputs' two slots%s)\n",
        device_resident(r) ? "" : " and the mirrors of the ZeRO buffers in flight");
  if (world > 1 || session.traffic.tensor > 0) {
    std::printf("\ncommunication per rank and optimizer step: %s (gradients %s, parameters %s",
                format_bytes(session.traffic.total()).c_str(), format_bytes(session.traffic.gradients).c_str(),
                format_bytes(session.traffic.parameters).c_str());
    if (session.traffic.tensor > 0)
      std::printf(", tensor-parallel all-reduces and the loss's gathers %s",
                  format_bytes(session.traffic.tensor).c_str());
    std::printf(")\n");
  }
  if (m.swap) {
    std::printf(
        "\noffload (docs/offload.md): swap files %s per rank in %s; each optimizer step reads %s and writes %s of "
        "them\n",
        format_bytes(m.swap).c_str(), r.offload.nvme_path.c_str(), format_bytes(session.traffic.swap_read).c_str(),
        format_bytes(session.traffic.swap_written).c_str());
  }
  if (planned_for_cuda(r)) {
    const DeviceMemoryPlan d = plan_device_memory(session, r, world);
    std::string staged;
    if (device_resident(r, &staged))
      std::cout << "\ndevice memory per rank (run.device cuda: the step and the update on the GPU"
                << (uses_device_collectives(r, world) ? ", the gradients reduced there" : "")
                << "; exact but for cuDNN's attention workspace, which the device sizes, and NCCL's own buffers):\n";
    else
      std::cout << "\ndevice memory per rank (run.device cuda with " << staged
                << ": the step on the GPU, the reductions, update and gathers on the host; exact but for cuDNN's "
                   "attention workspace):\n";
    row("activation peak", d.activations);
    if (d.casts) row("fp32 cast copies", d.casts);
    row("inputs", d.inputs);
    row("parameters", d.parameters);
    row("gradients", d.gradients);
    if (d.masters) row("fp32 masters", d.masters);
    if (d.optimizer_state) row("optimizer state", d.optimizer_state);
    if (d.gradient_sum) row("gradient sum", d.gradient_sum);
    if (d.reduce_staging) row("reduce staging", d.reduce_staging);
    row("workspace", d.workspace);
    row("total", d.total());
  }
  print_stage_table(r, world, g.param_count());
  print_pipeline_stages(r, world);
  print_layouts(r, world * tensor * stages);
  if (fit.any()) print_fit(args, fit, loaded);
  return kExitOk;
}

}  // namespace engine::cli
