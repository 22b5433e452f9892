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
          .trajectory = run_trajectory(loaded),
          .world_size = 1,
          .observed = {}};
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
  widen_weights_band(golden.band, golden.trajectory.weights, golden.environment.cpu_isa, runs);
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
  std::unique_ptr<Communicator> comm = make_communicator({loaded.recipe.distributed.timeout});
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
                      .world_size = comm->size(),
                      .observed = {}};
    if (comm->rank() == 0) write_golden(out, golden);
  };
  if (comm->size() == 1) return run();
  try {
    run();
  } catch (const std::exception& e) {
    const bool user = dynamic_cast<const UserError*>(&e) != nullptr;
    spdlog::error("{}{}", user ? "" : "internal error: ", e.what());
    spdlog::default_logger()->flush();
    comm->abort_job(dynamic_cast<const CommunicationError*>(&e) ? kExitRankLost : user ? kExitUser : kExitInternal);
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

// `engine golden update`: while the recording is unchanged, the previous file's band never narrows
// (its variants ran an older engine on the same trajectory, and machines beyond this one relied on
// it) and its observed runs stay in it; a changed trajectory makes both stale.
void carry_previous(const GoldenFile& previous, GoldenFile& golden, const fs::path& recipe_path) {
  // Checked as if here were the recording's environment: bitwise, final weights included.
  if (!compare(previous, golden.trajectory, previous.environment).ok) {
    if (!previous.observed.empty())
      std::printf(
          "%s: %zu observed run(s) dropped with the old trajectory; run `engine golden trajectory` on those "
          "machines again and `engine golden observe` here\n",
          recipe_path.c_str(), previous.observed.size());
    return;
  }
  if (previous.band.steps.size() == golden.band.steps.size())
    for (size_t i = 0; i < golden.band.steps.size(); ++i)
      for (auto metric : {&StepBand::loss, &StepBand::grad_norm, &StepBand::lr})
        golden.band.steps[i].*metric = std::max(golden.band.steps[i].*metric, previous.band.steps[i].*metric);
  if (previous.band.weights.size() == golden.band.weights.size())
    for (size_t t = 0; t < golden.band.weights.size(); ++t)
      golden.band.weights[t] = std::max(golden.band.weights[t], previous.band.weights[t]);
  if (previous.observed.empty()) return;
  golden.observed = previous.observed;
  golden.band = with_observed(golden.band, golden.trajectory.steps, golden.observed);
  widen_weights_band(golden.band, golden.trajectory.weights, golden.environment.cpu_isa, golden.observed);
}

// `engine golden observe`: the trajectory `from`/<stem>.json, run by `engine golden trajectory` on
// another machine, joins the golden's band. It must be of this recipe as it resolves now, at the
// golden's world size, by this very engine build (so a changed kernel cannot widen a band for
// good), in another environment than the recording's.
void observe(const fs::path& recipe_path, const fs::path& from) {
  const fs::path path = golden_path(recipe_path);
  if (!fs::exists(path)) throw UserError(path.string() + " does not exist; record it first (engine golden record)");
  GoldenFile golden = read_golden(path);
  const fs::path file = from / (recipe_path.stem().string() + ".json");
  if (!fs::exists(file)) throw UserError(file.string() + ": no trajectory for " + recipe_path.string());
  const GoldenFile run = read_golden(file);
  const LoadedRecipe loaded = load_at(recipe_path, golden.world_size, "the golden file " + path.string());
  if (run.recipe_hash != recipe_hash(loaded))
    throw UserError(file.string() + " ran another version of " + recipe_path.string() + " (hash " + run.recipe_hash +
                    ", the recipe now " + recipe_hash(loaded) + "): run `engine golden trajectory` there again");
  if (run.engine_commit != kGitRevision)
    throw UserError(file.string() + " was run by engine " + run.engine_commit + " and this is " + kGitRevision +
                    ": observe the runs of the build that checks them (the same commit on both machines)");
  if (run.world_size != golden.world_size)
    throw UserError(file.string() + " trained on " + std::to_string(run.world_size) + " rank(s), the golden on " +
                    std::to_string(golden.world_size));
  if (run.environment.differences(golden.environment).empty())
    throw UserError(file.string() +
                    " ran in the recording's own environment: `engine golden check` compares such a "
                    "run bitwise, so it cannot widen the band");
  const Band before = golden.band;
  const VariantRun observed{.label = "observed (engine " + run.engine_commit + ")",
                            .environment = run.environment,
                            .steps = run.trajectory.steps,
                            .weights = run.trajectory.weights};
  golden.band = with_observed(golden.band, golden.trajectory.steps, {observed});
  widen_weights_band(golden.band, golden.trajectory.weights, golden.environment.cpu_isa, {observed});
  // A second run from the same kind of machine replaces the first.
  std::erase_if(golden.observed,
                [&](const VariantRun& v) { return v.environment.differences(run.environment).empty(); });
  golden.observed.push_back(observed);
  write_golden(path, golden);
  double widest = 1;
  for (size_t i = 0; i < before.steps.size(); ++i)
    for (auto metric : {&StepBand::loss, &StepBand::grad_norm, &StepBand::lr})
      widest = std::max(widest, golden.band.steps[i].*metric / before.steps[i].*metric);
  std::printf("%s: observed %s, %d threads; ", recipe_path.c_str(), run.environment.cpu_isa.c_str(),
              run.environment.threads);
  if (before.empty())
    std::printf("the golden had no band: it is this run's now\n");
  else if (widest > 1)
    std::printf("band widened up to %.1fx\n", widest);
  else
    std::printf("the band already covered it\n");
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
      case GoldenArgs::Action::observe:
        observe(recipe_path, args.from);
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
          const GoldenFile previous = read_golden(path);
          carry_previous(previous, golden, recipe_path);
          Comparison comparison = compare(previous, golden.trajectory, golden.environment);
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
