// engine golden record|check|update|trajectory: golden-recipe regression tests as a CLI feature.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"
#include "dist/communicator.h"
#include "golden/golden.h"
#include "golden/gradient_noise.h"
#include "golden/variants.h"

namespace engine::cli {

namespace fs = std::filesystem;
using namespace engine::recipe;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A run of the recipe in this process's environment, without a band: in-process at world size 1,
// else as `mpirun -n W engine golden trajectory` (whose file carries rank 0's environment).
GoldenFile recording_of(const fs::path& recipe_path, const LoadedRecipe& loaded, int world) {
  if (world > 1) return run_trajectory_processes(fs::read_symlink("/proc/self/exe"), recipe_path, world);
  return {.engine_version = kVersion,
          .engine_commit = kGitRevision,
          .recipe_hash = recipe_hash(loaded),
          .environment = current_environment(),
          .band = {},
          .trajectory = run_trajectory(loaded)};
}

// The recording, its environment, and (unless disabled) the band from reruns in forced environments.
GoldenFile record(const fs::path& recipe_path, const LoadedRecipe& loaded, const GoldenArgs& args, int world) {
  GoldenFile golden = recording_of(recipe_path, loaded, world);
  if (!args.variants) return golden;
  std::vector<VariantRun> runs;
  const fs::path self = fs::read_symlink("/proc/self/exe");
  for (const VariantSpec& spec : default_variants(golden.environment.threads))
    runs.push_back(run_variant(self, recipe_path, spec, world));
  BandRule rule;
  rule.safety_factor = args.safety_factor;
  golden.band = derive_band(golden.trajectory.steps, runs, rule);
  return golden;
}

LoadedRecipe load_at(const fs::path& recipe_path, int world, const std::string& source) {
  LoadOptions options;
  if (world != 1) options.world = {world, source};
  return load_recipe(recipe_path, options);
}

// `engine golden trajectory`: one rank of `world_size_from_environment()` (every rank runs, rank 0
// writes). A rank that fails ends the job, as the others may wait in a collective it never joins.
void write_trajectory(const fs::path& recipe_path, const fs::path& out, bool gradient_noise) {
  LoadOptions options;
  options.world = world_size_from_environment();
  LoadedRecipe loaded = load_recipe(recipe_path, options);
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator({loaded.recipe.distributed.timeout});
  if (comm->size() != loaded.world.size)
    throw UserError("world size " + std::to_string(loaded.world.size) + " (from " + loaded.world.source +
                    ") but this process is one of " + std::to_string(comm->size()));
  TrajectoryProbes probes;
  // The variant's noise has its own seed; the power test's another (tests/golden/golden_power_test.cpp).
  if (gradient_noise)
    probes.after_backward = [](int64_t step, Session& session) { add_one_ulp_gradient_noise(1, step, session); };
  auto run = [&] {
    GoldenFile golden{.engine_version = kVersion,
                      .engine_commit = kGitRevision,
                      .recipe_hash = recipe_hash(loaded),
                      .environment = current_environment(),
                      .band = {},
                      .trajectory = run_trajectory(loaded, probes, comm.get()),
                      .world_size = comm->size()};
    if (comm->rank() == 0) write_golden(out, golden);
  };
  if (comm->size() == 1) return run();
  try {
    run();
  } catch (const std::exception& e) {
    const bool user = dynamic_cast<const UserError*>(&e) != nullptr;
    spdlog::error("{}{}", user ? "" : "internal error: ", e.what());
    spdlog::default_logger()->flush();
    comm->abort_job(dynamic_cast<const dist::CommunicationError*>(&e) ? kExitRankLost
                    : user                                            ? kExitUser
                                                                      : kExitInternal);
  }
}

// The world size an existing golden file was recorded at (1 when there is none or it cannot be
// read: then it is recorded anew at the default).
int recorded_world_size(const fs::path& path) {
  if (!fs::exists(path)) return 1;
  try {
    return read_golden(path).world_size;
  } catch (const UserError&) {
    return 1;
  }
}

}  // namespace

int golden(const GoldenArgs& args) {
  if (args.action == GoldenArgs::Action::trajectory) {
    write_trajectory(args.recipes.at(0), args.out, args.gradient_noise);
    return kExitOk;
  }
  if (const WorldSize launched = world_size_from_environment(); launched.size != 1)
    throw UserError("engine golden record, check and update start their own ranks (world size " +
                    std::to_string(launched.size) + " comes from " + launched.source +
                    "): run them without mpirun, and record a golden at several ranks with --world-size N");
  int status = kExitOk;
  for (const fs::path& recipe_path : args.recipes) {
    const fs::path path = golden_path(recipe_path);
    const auto start = std::chrono::steady_clock::now();
    switch (args.action) {
      case GoldenArgs::Action::trajectory:
        break;
      case GoldenArgs::Action::record: {
        const int world = args.world_size;
        LoadedRecipe loaded = load_at(recipe_path, world, "--world-size on the command line");
        if (fs::exists(path))
          throw UserError(path.string() + " exists; use `engine golden update` to rewrite it deliberately");
        GoldenFile golden = record(recipe_path, loaded, args, world);
        write_golden(path, golden);
        std::printf("%s: recorded %zu steps%s (%zu variant runs for the band) in %.1f s -> %s\n", recipe_path.c_str(),
                    golden.trajectory.steps.size(),
                    world > 1 ? (" on " + std::to_string(world) + " ranks").c_str() : "", golden.band.variants.size(),
                    seconds_since(start), path.c_str());
        break;
      }
      case GoldenArgs::Action::update: {
        const int world = recorded_world_size(path);
        LoadedRecipe loaded = load_at(recipe_path, world, "the golden file " + path.string());
        GoldenFile golden = record(recipe_path, loaded, args, world);
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
        const int world = recorded_world_size(path);
        LoadedRecipe loaded = load_at(recipe_path, world, "the golden file " + path.string());
        GoldenFile expected = read_golden(path);
        GoldenFile now = recording_of(recipe_path, loaded, world);
        const Trajectory& got = now.trajectory;
        Comparison comparison = compare(expected, got, now.environment);
        if (comparison.ok) {
          std::printf("%s: ok (%zu steps%s; %s) in %.1f s\n", recipe_path.c_str(), got.steps.size(),
                      world > 1 ? (" on " + std::to_string(world) + " ranks").c_str() : "", comparison.mode.c_str(),
                      seconds_since(start));
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
