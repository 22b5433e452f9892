// Golden trajectories: a recipe's training behaviour, recorded once and checked on every change.
//
// A golden file sits next to its recipe (recipes/golden/gpt.yaml -> gpt.golden.json) and holds
// every step's loss, gradient norm and learning rate, a digest of the final weights, the engine
// version, a hash of the resolved recipe and the tolerance policy: `exact` (bitwise, for the
// deterministic CPU paths) or rtol/atol per metric. `engine golden check` reruns the recipe and
// compares; a regression prints the first diverging step, the steps around it and the largest
// deviation, and exits with status 3.
//
//   Trajectory now = run_trajectory(load_recipe("recipes/golden/gpt.yaml"));
//   Comparison c = compare(read_golden("recipes/golden/gpt.golden.json"), now);
//   if (!c.ok) std::cout << c.report;
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "recipe/load.h"

namespace engine {

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
};

struct Trajectory {
  std::vector<StepMetrics> steps;
  std::string weights_digest;  // FNV-1a 64 of the final parameter bytes, hex
};

struct MetricTolerance {
  double rtol = 0, atol = 0;
};

struct TolerancePolicy {
  bool exact = true;
  MetricTolerance loss, grad_norm, lr;
  std::string describe() const;
};

struct GoldenFile {
  std::string engine_version;
  std::string recipe_hash;
  TolerancePolicy policy;
  Trajectory trajectory;
};

struct Comparison {
  bool ok = true;
  std::string report;    // readable: empty when ok
  std::string movement;  // largest change per metric, for `engine golden update`
};

std::filesystem::path golden_path(const std::filesystem::path& recipe);
std::string recipe_hash(const recipe::LoadedRecipe& loaded);

// Trains the recipe in-process exactly as `engine train` does, without writing anything.
Trajectory run_trajectory(const recipe::LoadedRecipe& loaded);

GoldenFile read_golden(const std::filesystem::path& path);  // throws UserError
void write_golden(const std::filesystem::path& path, const GoldenFile& golden);

Comparison compare(const GoldenFile& expected, const Trajectory& got);

}  // namespace engine
