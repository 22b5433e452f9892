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

int64_t host_bytes_needed(const MemoryPlan& memory, int ranks) {
  return (memory.total() + memory.checkpoint_snapshot) * ranks;
}

double FitRow::overshoot(const FitBudgets& b) const {
  auto ratio = [](int64_t need, int64_t budget) {
    if (need <= budget) return need == 0 ? 0.0 : double(need) / double(std::max<int64_t>(budget, 1));
    return budget <= 0 ? HUGE_VAL : double(need) / double(budget);
  };
  return std::max({ratio(host_needed, b.host), ratio(swap_needed, b.nvme), ratio(device_needed, b.device)});
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
  const CompiledStep c = compile_step(r, world);
  row.stage = int(r.distributed.zero_stage);
  row.optimizer = r.offload.optimizer;
  row.parameters = r.offload.parameters;
  row.policy = r.activation_checkpointing.policy;
  row.micro = *r.train.micro_batch_size;
  row.accumulation = *r.train.gradient_accumulation_steps;
  row.host = c.memory.total();
  row.host_needed = host_bytes_needed(c.memory, world);
  row.swap = c.memory.swap;
  row.swap_needed = c.memory.swap * world;
  row.swap_moved = c.traffic.swap_read + c.traffic.swap_written;
  row.flops = c.flops_per_micro_batch * double(row.accumulation);
  row.extra_flops = c.recompute.extra_flops * double(row.accumulation);
  row.seconds = row.flops / cost.flops_per_second + double(row.swap_moved) / cost.swap_bytes_per_second;
  if (!planned_for_cuda(r)) return;
  row.device = plan_device_memory(c, r, world).total();
  row.device_needed = row.device * ranks_per_device;
  if (device_resident(r, world)) return;
  // Staged: each micro-batch uploads the parameters (ZeRO-3: gathered for the forward and again for
  // the backward) and downloads the gradients; the host reduces and updates over its shard.
  const Graph& g = c.model.graph;
  const auto elements = double(g.param_count());
  const double parameters = elements * double(dtype_size(g.param_dtype())) * (row.stage == 3 ? 2 : 1);
  const double gradients = elements * double(dtype_size(g.grad_dtype()));
  row.link_moved = int64_t((parameters + gradients) * double(row.accumulation));
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

  const int64_t micro = *r.train.micro_batch_size, per_rank_rows = micro * *r.train.gradient_accumulation_steps;
  std::vector<int64_t> micros;
  for (int64_t m = micro; m >= 1; m /= 2)
    if (per_rank_rows % m == 0) micros.push_back(m);
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

  for (int stage = 0; stage <= 3; ++stage)
    for (auto [optimizer, parameters] : offloads)
      for (CheckpointPolicy policy : policies)
        for (int64_t m : micros) {
          if (parameters != OffloadTier::none && stage != 3) continue;
          const bool nvme = optimizer == OffloadTier::nvme;
          const int64_t accumulation = per_rank_rows / m;
          if (stage == r.distributed.zero_stage && optimizer == r.offload.optimizer &&
              parameters == r.offload.parameters && policy == r.activation_checkpointing.policy && m == micro)
            continue;  // the recipe as given
          FitRow row;
          std::vector<std::string>& o = row.overrides;
          auto set = [&](bool differs, const std::string& key, const std::string& value) {
            if (differs) o.push_back(key + "=" + value);
          };
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
  return search;
}

namespace {

// Among equally fast rows: fewer changes from the recipe, then the larger micro-batch (the cost
// model counts FLOPs, not how much faster larger matmuls run them), then less memory.
auto preference(const FitRow& row) {
  return std::make_tuple(row.seconds, row.overrides.size(), -row.micro, row.host_needed, row.swap_needed, row.device);
}

}  // namespace

const FitRow* fastest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets) {
  const FitRow* best = nullptr;
  for (const FitRow& row : rows)
    if (row.fits(budgets) && (!best || preference(row) < preference(*best))) best = &row;
  return best;
}

const FitRow* closest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets) {
  const FitRow* best = nullptr;
  for (const FitRow& row : rows)
    if (!best || std::make_tuple(row.overshoot(budgets), preference(row)) <
                     std::make_tuple(best->overshoot(budgets), preference(*best)))
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
