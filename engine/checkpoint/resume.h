// Resuming: which checkpoint a run continues from, which recipe changes it accepts, and how the
// global batch is kept when the world size changes (elastic gradient accumulation).
//
//   std::optional<fs::path> from = resume_source(recipe, "--resume" argument or "");
//   Manifest m = read_manifest(*from);
//   std::vector<std::string> notes = check_recipe_change(m.recipe, current_yaml);   // or UserError
//   keep_global_batch(recipe, m.state, world, notes);                               // or UserError
//
// Accepted changes: train.steps (more of them, or fewer that are still ahead), the learning-rate
// schedule (scheduler.*, optimizer.lr, weight decay, clipping: they apply from the next step), how
// the run is logged, evaluated, checkpointed, distributed or recomputed, and the plugins. Refused:
// anything that changes the model, the data or its order, the optimizer's kind and state meaning,
// the precision of the masters' copies, the seed or the micro-batch size.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace engine {

// `argument`: "" (none given: the recipe's checkpoint.resume decides), "latest", or a path to a
// checkpoint or to a directory of checkpoints (its latest). None when starting from step 0.
std::optional<std::filesystem::path> resume_source(const recipe::Recipe& r, const std::string& argument);

// Notes for the accepted changes between the checkpoint's resolved recipe and this one; throws
// UserError listing every refused change with both values.
std::vector<std::string> check_recipe_change(const std::string& saved_yaml, const std::string& current_yaml);

// Sets gradient accumulation so that micro_batch x accumulation x world equals the checkpoint's
// global batch, noting what changed; UserError with the arithmetic when it cannot.
void keep_global_batch(recipe::Recipe& r, const nlohmann::json& state, int world, std::vector<std::string>& notes);

}  // namespace engine
