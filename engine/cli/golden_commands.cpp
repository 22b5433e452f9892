// engine golden record|check|update|trajectory: golden-recipe regression tests as a CLI feature.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"
#include "golden/golden.h"
#include "golden/variants.h"

namespace engine::cli {

namespace fs = std::filesystem;
using namespace engine::recipe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A run of the recipe in this process's environment, without a band.
GoldenFile recording_of(const LoadedRecipe& loaded) {
  return {.engine_version = kVersion,
          .engine_commit = kGitRevision,
          .recipe_hash = recipe_hash(loaded),
          .environment = current_environment(),
          .band = {},
          .trajectory = run_trajectory(loaded)};
}

// The recording, its environment, and (unless disabled) the band from reruns in forced environments.
GoldenFile record(const fs::path& recipe_path, const LoadedRecipe& loaded, const GoldenArgs& args) {
  GoldenFile golden = recording_of(loaded);
  if (!args.variants) return golden;
  std::vector<VariantRun> runs;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const VariantSpec& spec : default_variants(golden.environment.threads))
    runs.push_back(run_variant(self, recipe_path, spec));
  BandRule rule;
  rule.safety_factor = args.safety_factor;
  golden.band = derive_band(golden.trajectory.steps, runs, rule);
  return golden;
}

}  // namespace

int golden(const GoldenArgs& args) {
  require_single_process(world_size_from_environment(), "golden");
  int status = kExitOk;
  for (const fs::path& recipe_path : args.recipes) {
    LoadedRecipe loaded = load_recipe(recipe_path);
    const fs::path path = golden_path(recipe_path);
    const auto start = std::chrono::steady_clock::now();
    switch (args.action) {
      case GoldenArgs::Action::trajectory: {
        write_golden(args.out, recording_of(loaded));
        break;
      }
      case GoldenArgs::Action::record: {
        if (fs::exists(path))
          throw UserError(path.string() + " exists; use `engine golden update` to rewrite it deliberately");
        GoldenFile golden = record(recipe_path, loaded, args);
        write_golden(path, golden);
        std::printf("%s: recorded %zu steps (%zu variant runs for the band) in %.1f s -> %s\n", recipe_path.c_str(),
                    golden.trajectory.steps.size(), golden.band.variants.size(), seconds_since(start), path.c_str());
        break;
      }
      case GoldenArgs::Action::update: {
        GoldenFile golden = record(recipe_path, loaded, args);
        if (!fs::exists(path)) {
          std::printf("%s: recorded in %.1f s (there was no golden file)\n", recipe_path.c_str(), seconds_since(start));
          write_golden(path, golden);
          break;
        }
        try {
          Comparison comparison = compare(read_golden(path), golden.trajectory, golden.environment);
          std::printf("%s: %s (%s) in %.1f s; what moved:\n%s", recipe_path.c_str(),
                      comparison.ok ? "unchanged" : "changed", comparison.mode.c_str(), seconds_since(start),
                      comparison.movement.c_str());
        } catch (const UserError& e) {  // an older format, or damaged: the new recording replaces it
          std::printf("%s: recorded anew in %.1f s (the previous file could not be read: %s)\n", recipe_path.c_str(),
                      seconds_since(start), e.what());
        }
        write_golden(path, golden);
        break;
      }
      case GoldenArgs::Action::check: {
        GoldenFile expected = read_golden(path);
        Trajectory got = run_trajectory(loaded);
        Comparison comparison = compare(expected, got, current_environment());
        if (comparison.ok) {
          std::printf("%s: ok (%zu steps; %s) in %.1f s\n", recipe_path.c_str(), got.steps.size(),
                      comparison.mode.c_str(), seconds_since(start));
          break;
        }
        std::printf("%s: REGRESSION against %s (recorded by engine %s at %s)\n  %s\n%s", recipe_path.c_str(),
                    path.c_str(), expected.engine_version.c_str(), expected.engine_commit.c_str(),
                    comparison.mode.c_str(), comparison.report.c_str());
        const std::string hash = recipe_hash(loaded);
        if (hash != expected.recipe_hash)
          std::printf("  note: the resolved recipe changed since recording (hash %s, now %s)\n",
                      expected.recipe_hash.c_str(), hash.c_str());
        status = kExitRegression;
        break;
      }
    }
  }
  return status;
}

}  // namespace engine::cli
