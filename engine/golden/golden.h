// Golden trajectories: a recipe's training behaviour, recorded once and checked on every change.
//
// A golden file sits next to its recipe (recipes/golden/gpt.yaml -> gpt.golden.json) and holds
// every step's loss, gradient norm and learning rate, a digest and a fingerprint of the final
// weights, the engine
// version and commit, a hash of the resolved recipe, the numeric environment of the recording
// (golden/environment.h) and a tolerance band per step derived from reruns in other environments
// (golden/band.h). `engine golden check` reruns the recipe and compares:
//   - bitwise, final weights included, when this process's environment equals the recording's;
//   - within the band otherwise, final weights by their fingerprint, saying which fields of the
//     environment differ.
// Non-finite values are kept apart by class: NaN, +inf and -inf each match only themselves.
// A golden file records the world size it was trained at; above 1, every run of it (recording,
// variants, check) is `mpirun -n W engine golden trajectory` in child processes (golden/variants.h).
// Runs on machines whose kernels no cap here can force (an AMX CPU) join the band as observed runs:
// `engine golden trajectory` there, `engine golden observe --from DIR` here (golden/band.h).
// A regression prints the first diverging step, the steps around it and the largest deviation,
// and `engine golden check` exits with status 3.
//
//   Trajectory now = run_trajectory(load_recipe("recipes/golden/gpt.yaml"));
//   Comparison c = compare(read_golden("recipes/golden/gpt.golden.json"), now, current_environment());
//   std::cout << c.mode << "\n" << c.report;
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "golden/band.h"
#include "golden/environment.h"
#include "recipe/load.h"

namespace engine {

class Session;
class Communicator;

struct StepMetrics {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0;
};

struct Trajectory {
  std::vector<StepMetrics> steps;
  // FNV-1a 64 of the final fp32 parameters, unit by unit and in offset order within a unit (no
  // padding), hex: the same bits at every world size and ZeRO stage for the same weights.
  std::string weights_digest;
  WeightsFingerprint weights;  // the same weights, for the band (weights_fingerprint.h)
};

// finite, nan, +inf or -inf: values of different classes never match.
enum class ValueClass { finite, nan, positive_infinity, negative_infinity };
ValueClass value_class(double value);

struct GoldenFile {
  std::string engine_version;
  std::string engine_commit;
  std::string recipe_hash;
  NumericEnvironment environment;
  Band band;  // empty: only a bitwise check in the recording environment is possible
  Trajectory trajectory;
  int world_size = 1;  // ranks the recipe trained on (absent from the file: 1)
  // Trajectories of this recording's engine run on other machines (engine golden observe), kept so
  // that `engine golden update` can carry them into a new band while the trajectory is unchanged.
  std::vector<VariantRun> observed;
};

struct Comparison {
  bool ok = true;
  bool bitwise = true;   // compared bitwise (environment matches) or within the band
  double band_used = 0;  // within the band: the largest deviation as a fraction of the band there
  std::string mode;      // one line: which comparison ran and why
  std::string report;    // readable: empty when ok
  std::string movement;  // largest change per metric, for `engine golden update`
};

std::filesystem::path golden_path(const std::filesystem::path& recipe);
std::string recipe_hash(const recipe::LoadedRecipe& loaded);

// Test seams: a run may be altered on purpose to prove that the check catches (or tolerates) it.
struct TrajectoryProbes {
  // Called after each step's backward with the session (gradients accumulated, before the update).
  std::function<void(int64_t step, Session&)> after_backward;
  // Called before each update; may change the learning rate (result.lr).
  std::function<void(int64_t step, double& lr)> before_update;
  // Maps a step to the step whose batches it trains on (a changed data order); identity by default.
  std::function<int64_t(int64_t step)> batch_of_step;
};

// Trains the recipe in-process exactly as `engine train` does, without writing anything: alone,
// or as rank comm->rank() of comm->size() (every rank calls it; each returns the same trajectory).
Trajectory run_trajectory(const recipe::LoadedRecipe& loaded, const TrajectoryProbes& probes = {},
                          Communicator* comm = nullptr);

GoldenFile read_golden(const std::filesystem::path& path);  // throws UserError
void write_golden(const std::filesystem::path& path, const GoldenFile& golden);

Comparison compare(const GoldenFile& expected, const Trajectory& got, const NumericEnvironment& here);

}  // namespace engine
