#include "trainer/fit.h"

#include <algorithm>
#include <cmath>
#include <system_error>
#include <tuple>

#include "core/device_info.h"
#include "optim/optimizer.h"
#include "trainer/device.h"

namespace engine {

namespace fs = std::filesystem;
using recipe::CheckpointPolicy;

int64_t host_bytes_needed(const MemoryPlan& memory, int ranks, bool streamed) {
  return (memory.total() + (streamed ? memory.streamed_checkpoint : memory.checkpoint_snapshot)) * ranks;
}

double FitRow::overshoot(const FitBudgets& b) const {
  auto ratio = [](int64_t need, int64_t budget) {
    if (need <= budget) return need == 0 ? 0.0 : double(need) / double(std::max<int64_t>(budget, 1));
    return budget <= 0 ? HUGE_VAL : double(need) / double(budget);
  };
  return std::max({ratio(host_proposed(b), b.host), ratio(swap_needed, b.nvme), ratio(device_needed, b.device)});
}

std::string FitRow::layout_name() const {
  return std::to_string(tensor) + " x " + std::to_string(pipeline) + " x " + std::to_string(data);
}

std::vector<std::pair<int, int>> model_layouts(const recipe::Recipe& r, int ranks) {
  std::vector<std::pair<int, int>> layouts;
  if (r.model.arch == recipe::Arch::mlp) return {{1, 1}};
  const auto& m = r.model;
  for (int t = 1; t <= ranks; ++t)
    for (int p = 1; p <= ranks / t; ++p) {
      if (ranks % (t * p) != 0 || m.n_layer < p) continue;
      if (m.n_head % t != 0 || m.kv_heads.value_or(m.n_head) % t != 0 || m.ffn_dim.value_or(0) % t != 0 ||
          m.vocab_size % t != 0)
        continue;
      layouts.emplace_back(t, p);
    }
  return layouts;
}

std::string FitRow::offload_name() const {
  if (optimizer == OffloadTier::none) return "none";
  return std::string(parameters != OffloadTier::none ? "optimizer+parameters " : "optimizer ") +
         offload_tier_name(optimizer);
}

namespace {

// Loads the recipe with the row's overrides after the command line's and plans it.
void plan_row(FitRow& row, const fs::path& path, const recipe::LoadOptions& options, const CostModel& cost,
              int ranks_per_device) {
  recipe::LoadOptions with_row = options;
  with_row.overrides.insert(with_row.overrides.end(), row.overrides.begin(), row.overrides.end());
  const recipe::LoadedRecipe loaded = recipe::load_recipe(path, with_row);
  const recipe::Recipe& r = loaded.recipe;
  const int world = int(loaded.world.size);
  row.tensor = int(r.distributed.tensor_parallel);
  row.pipeline = int(r.distributed.pipeline_parallel);
  row.data = std::max(1, world / (row.tensor * row.pipeline));
  // Every stage's plan (one without a pipeline): the row's numbers are its busiest rank's, and the
  // machine holds T x D ranks of each stage.
  std::vector<CompiledStep> stages;
  for (int s = 0; s < row.pipeline; ++s)
    stages.push_back(compile_step(r, row.data, {row.tensor, 0}, {row.pipeline, s}));
  const CompiledStep* c = &stages.front();
  for (const CompiledStep& stage : stages) {
    if (stage.memory.total() > c->memory.total()) c = &stage;
    row.host_needed += host_bytes_needed(stage.memory, row.tensor * row.data);
    row.host_needed_streamed += host_bytes_needed(stage.memory, row.tensor * row.data, true);
    row.swap_needed += stage.memory.swap * row.tensor * row.data;
    row.flops = std::max(row.flops, stage.flops_per_micro_batch * double(*r.train.gradient_accumulation_steps));
    row.sent = std::max(row.sent, stage.traffic.total());
  }
  row.stage = int(r.distributed.zero_stage);
  row.optimizer = r.offload.optimizer;
  row.parameters = r.offload.parameters;
  row.policy = r.activation_checkpointing.policy;
  row.micro = *r.train.micro_batch_size;
  row.accumulation = *r.train.gradient_accumulation_steps;
  row.host = c->memory.total();
  row.swap = c->memory.swap;
  row.swap_moved = c->traffic.swap_read + c->traffic.swap_written;
  row.extra_flops = c->recompute.extra_flops * double(row.accumulation);
  const double bubble = double(row.accumulation + row.pipeline - 1) / double(row.accumulation);
  row.seconds = row.flops / cost.flops_per_second * bubble + double(row.sent) / cost.interconnect_bytes_per_second +
                double(row.swap_moved) / cost.swap_bytes_per_second;
  if (!planned_for_cuda(r)) return;
  const CompiledStep& step = *c;  // one stage: a GPU run has no pipeline
  row.device = plan_device_memory(step, r, world).total();
  row.device_needed = row.device * ranks_per_device;
  if (device_resident(r)) return;
  // Staged: the parameters uploaded once a step, after the host's update (ZeRO-3: gathered for the
  // forward and again for the backward of every micro-batch), and every micro-batch's gradients
  // downloaded; the host reduces and updates over its shard.
  const Graph& g = step.model.graph;
  const auto elements = double(g.param_count());
  const double parameters = elements * double(dtype_size(g.param_dtype()));
  const double gradients = elements * double(dtype_size(g.grad_dtype()));
  const double accumulation = double(row.accumulation);
  row.link_moved = int64_t((row.stage == 3 ? 2 * parameters * accumulation : parameters) + gradients * accumulation);
  const double shard = elements / (row.stage == 0 ? 1 : world);
  const double update_bytes = shard * 4 * (2 + 2 * double(optimizer_state_tensors(r.optimizer)));
  row.seconds += double(row.link_moved) / cost.link_bytes_per_second + update_bytes / cost.host_update_bytes_per_second;
}

}  // namespace

FitSearch fit_rows(const fs::path& path, const recipe::LoadOptions& options, const recipe::LoadedRecipe& loaded,
                   const CostModel& cost) {
  const recipe::Recipe& r = loaded.recipe;
  FitSearch search;
  search.nvme_path_given = !r.offload.nvme_path.empty();
  search.nvme_path = search.nvme_path_given ? fs::path(r.offload.nvme_path) : fs::temp_directory_path();

  search.device = planned_for_cuda(r);
  const int devices = cuda_device_count();
  search.world = int(loaded.world.size);
  search.ranks_per_device = devices > 0 ? (search.world + devices - 1) / devices : 1;
  FitRow as_given;
  as_given.is_recipe = true;
  plan_row(as_given, path, options, cost, search.ranks_per_device);
  search.rows.push_back(as_given);

  // The layouts: the recipe's, then (a CPU run of a transformer over several ranks) every other the
  // model splits into, each keeping the global batch over its data-parallel ranks.
  // Without a world size that T x P divides (none given: one data-parallel rank of the recipe's
  // layout), the recipe's layout alone.
  const int recipe_t = int(r.distributed.tensor_parallel), recipe_p = int(r.distributed.pipeline_parallel);
  const bool whole_world = search.world % (recipe_t * recipe_p) == 0;
  const int64_t micro = *r.train.micro_batch_size, global_rows = micro * *r.train.gradient_accumulation_steps *
                                                                 std::max(1, search.world / (recipe_t * recipe_p));
  std::vector<std::pair<int, int>> layouts = {{recipe_t, recipe_p}};
  if (!search.device && whole_world)
    for (const auto& layout : model_layouts(r, search.world))
      if (layout != layouts.front()) layouts.push_back(layout);
  search.layouts = layouts.size() > 1;
  std::vector<CheckpointPolicy> policies = {CheckpointPolicy::none, CheckpointPolicy::selective,
                                            CheckpointPolicy::full};
  if (r.activation_checkpointing.policy == CheckpointPolicy::every_k) policies.push_back(CheckpointPolicy::every_k);

  // Offload (optimizer, parameters): to nvme; on a GPU run also to host memory (ZeRO-Offload);
  // the parameters at stage 3 only, with the optimizer state.
  std::vector<OffloadTier> tiers = {OffloadTier::none, OffloadTier::nvme};
  if (search.device) tiers.insert(tiers.begin() + 1, OffloadTier::cpu);
  std::vector<std::pair<OffloadTier, OffloadTier>> offloads;
  for (OffloadTier t : tiers) offloads.emplace_back(t, OffloadTier::none);
  for (OffloadTier t : tiers)
    if (t != OffloadTier::none) offloads.emplace_back(t, t);

  for (const auto& [t, p] : layouts) {
    const int data = std::max(1, search.world / (t * p));
    if (global_rows % data != 0) {
      search.notes.push_back("layout " + std::to_string(t) + " x " + std::to_string(p) + " x " + std::to_string(data) +
                             " not planned: its " + std::to_string(data) +
                             " data-parallel ranks do not divide the global batch of " + std::to_string(global_rows));
      continue;
    }
    const int64_t per_rank_rows = global_rows / data;
    std::vector<int64_t> micros;
    for (int64_t m = std::min(micro, per_rank_rows); m >= 1; m /= 2)
      if (per_rank_rows % m == 0) micros.push_back(m);
    const bool recipe_layout = t == recipe_t && p == recipe_p;
    for (int stage = 0; stage <= 3; ++stage)
      for (auto [optimizer, parameters] : offloads)
        for (CheckpointPolicy policy : policies)
          for (int64_t m : micros) {
            if (parameters != OffloadTier::none && stage != 3) continue;
            const bool nvme = optimizer == OffloadTier::nvme;
            const int64_t accumulation = per_rank_rows / m;
            if (recipe_layout && stage == r.distributed.zero_stage && optimizer == r.offload.optimizer &&
                parameters == r.offload.parameters && policy == r.activation_checkpointing.policy && m == micro)
              continue;  // the recipe as given
            FitRow row;
            std::vector<std::string>& o = row.overrides;
            auto set = [&](bool differs, const std::string& key, const std::string& value) {
              if (differs) o.push_back(key + "=" + value);
            };
            set(t != recipe_t, "distributed.tensor_parallel", std::to_string(t));
            set(p != recipe_p, "distributed.pipeline_parallel", std::to_string(p));
            // The recipe's blocks per stage list its own number of stages.
            set(p != recipe_p && !r.distributed.pipeline_blocks.empty(), "distributed.pipeline_blocks", "[]");
            // Stages cut at blocks: the wrap policy that makes each block its own unit.
            set(p > 1 && r.distributed.wrap_policy != recipe::WrapPolicy::block, "distributed.wrap_policy", "block");
            set(stage != r.distributed.zero_stage, "distributed.zero_stage", std::to_string(stage));
            set(optimizer != r.offload.optimizer, "offload.optimizer", offload_tier_name(optimizer));
            set(parameters != r.offload.parameters, "offload.parameters", offload_tier_name(parameters));
            set(nvme && !search.nvme_path_given, "offload.nvme_path", search.nvme_path.string());
            set(policy != r.activation_checkpointing.policy, "activation_checkpointing.policy", policy_name(policy));
            // Keys that only apply to some policies go with them.
            if (policy != CheckpointPolicy::every_k && loaded.given("activation_checkpointing.k"))
              o.push_back("~activation_checkpointing.k");
            if ((policy == CheckpointPolicy::none || policy == CheckpointPolicy::selective) &&
                loaded.given("activation_checkpointing.cpu_checkpointing"))
              o.push_back("~activation_checkpointing.cpu_checkpointing");
            set(m != micro, "train.micro_batch_size", std::to_string(m));
            set(accumulation != *r.train.gradient_accumulation_steps, "train.gradient_accumulation_steps",
                std::to_string(accumulation));
            try {
              plan_row(row, path, options, cost, search.ranks_per_device);
              search.rows.push_back(std::move(row));
            } catch (const UserError& e) {  // RecipeError included: a combination the rules refuse
              std::string overrides;
              for (const std::string& text : row.overrides) overrides += " " + text;
              search.notes.push_back("not planned:" + overrides + ": " + e.what());
            }
          }
  }
  return search;
}

namespace {

// Among equally fast rows: fewer changes from the recipe (checkpoint.async=false where the row
// needs it is one), then the larger micro-batch (the cost model counts FLOPs, not how much faster
// larger matmuls run them), then less memory.
auto preference(const FitRow& row, const FitBudgets& budgets) {
  return std::make_tuple(row.seconds, row.overrides.size() + (row.proposes_streamed_checkpoints(budgets) ? 1 : 0),
                         -row.micro, row.host_needed, row.swap_needed, row.device);
}

}  // namespace

const FitRow* fastest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets) {
  const FitRow* best = nullptr;
  for (const FitRow& row : rows)
    if (row.fits_when_streamed(budgets) && (!best || preference(row, budgets) < preference(*best, budgets)))
      best = &row;
  return best;
}

const FitRow* closest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets) {
  const FitRow* best = nullptr;
  for (const FitRow& row : rows)
    if (!best || std::make_tuple(row.overshoot(budgets), preference(row, budgets)) <
                     std::make_tuple(best->overshoot(budgets), preference(*best, budgets)))
      best = &row;
  return best;
}

const char* policy_name(recipe::CheckpointPolicy p) {
  switch (p) {
    case recipe::CheckpointPolicy::full:
      return "full";
    case recipe::CheckpointPolicy::every_k:
      return "every_k";
    case recipe::CheckpointPolicy::selective:
      return "selective";
    case recipe::CheckpointPolicy::none:
      break;
  }
  return "none";
}

}  // namespace engine
