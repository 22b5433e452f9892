// engine golden record|check|update: golden-recipe regression tests as a CLI feature.
#include <chrono>
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"
#include "golden/golden.h"

namespace engine::cli {

namespace fs = std::filesystem;
using namespace engine::recipe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int golden(const GoldenArgs& args) {
  require_single_process(world_size_from_environment(), "golden");
  int status = kExitOk;
  for (const fs::path& recipe_path : args.recipes) {
    LoadedRecipe loaded = load_recipe(recipe_path);
    const fs::path path = golden_path(recipe_path);
    const auto start = std::chrono::steady_clock::now();
    if (args.action == GoldenArgs::Action::record) {
      if (fs::exists(path))
        throw UserError(path.string() + " exists; use `engine golden update` to rewrite it deliberately");
      TolerancePolicy policy;
      if (args.rtol > 0 || args.atol > 0) {
        policy.exact = false;
        policy.loss = policy.grad_norm = policy.lr = MetricTolerance{args.rtol, args.atol};
      }
      GoldenFile golden{kVersion, recipe_hash(loaded), policy, run_trajectory(loaded)};
      write_golden(path, golden);
      std::printf("%s: recorded %zu steps (policy: %s) in %.1f s -> %s\n", recipe_path.c_str(),
                  golden.trajectory.steps.size(), policy.describe().c_str(), seconds_since(start), path.c_str());
      continue;
    }
    GoldenFile expected = read_golden(path);
    Trajectory got = run_trajectory(loaded);
    Comparison comparison = compare(expected, got);
    std::string hash = recipe_hash(loaded);
    if (args.action == GoldenArgs::Action::update) {
      std::printf("%s: %s in %.1f s; what moved:\n%s", recipe_path.c_str(), comparison.ok ? "unchanged" : "changed",
                  seconds_since(start), comparison.movement.c_str());
      write_golden(path, GoldenFile{kVersion, hash, expected.policy, got});
      continue;
    }
    if (comparison.ok) {
      std::printf("%s: ok (%zu steps, policy: %s) in %.1f s\n", recipe_path.c_str(), got.steps.size(),
                  expected.policy.describe().c_str(), seconds_since(start));
    } else {
      std::printf("%s: REGRESSION against %s (recorded by engine %s)\n%s", recipe_path.c_str(), path.c_str(),
                  expected.engine_version.c_str(), comparison.report.c_str());
      if (hash != expected.recipe_hash)
        std::printf("  note: the resolved recipe changed since recording (hash %s, now %s)\n",
                    expected.recipe_hash.c_str(), hash.c_str());
      status = kExitRegression;
    }
  }
  return status;
}

}  // namespace engine::cli
