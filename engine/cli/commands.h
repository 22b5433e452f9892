// The `engine` command line: one function per subcommand, wired up in main.cpp.
//
// Exit codes (documented in `engine help exit-codes` and the README):
//   0  success
//   1  internal error (a bug in the engine: please report it with the message)
//   2  user error (bad recipe, bad override, missing file, bad command line)
//   3  regression: `engine golden check` found a trajectory that differs from its golden file
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "recipe/load.h"

namespace engine::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUser = 2;
inline constexpr int kExitRegression = 3;  // engine golden check: training behaviour changed
inline constexpr int kExitRankLost = 4;    // a collective did not complete: a rank died or hangs
// 75 (EX_TEMPFAIL): preempted by SIGTERM, SIGINT or SIGUSR1 after writing a checkpoint; requeue the
// job and it resumes (kExitRequeue in trainer/train.h).

struct RecipeArgs {
  std::filesystem::path recipe;
  std::vector<std::string> overrides;
  int64_t world_size = 0;                 // 0: from the environment
  std::filesystem::path first_gradients;  // train: --dump-first-gradients
  // train: --dump-gradients-at STEP PATH (repeatable)
  std::vector<std::pair<int64_t, std::string>> gradients_at;
  std::string resume;      // train: --resume [latest|PATH]
  int64_t stop_after = 0;  // train: --stop-after STEP

  recipe::LoadOptions load_options() const;
};

// engine plan's budgets per memory tier and --fit (docs/offload.md, "Fitting a run to the machine").
// Sizes are as the user wrote them ("16GiB"); empty: the default.
struct FitArgs {
  std::string host_memory;      // default: the memory limit (core/memory_limit.h)
  std::string device_memory;    // a CPU run's device is the host: a host budget
  std::string nvme;             // default: free space of offload.nvme_path (else of the temporary directory)
  bool fit = false;             // propose the fastest configuration that fits
  double flops_per_second = 0;  // 0: CostModel's default
  std::string swap_bandwidth;   // bytes per second; empty: CostModel's default
  bool any() const { return fit || !host_memory.empty() || !device_memory.empty() || !nvme.empty(); }
};

struct GenerateArgs {
  std::filesystem::path run_dir;
  std::string prompt;
  std::filesystem::path tokenizer;  // tokenizer.json or its directory; default: the run's model directory
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  int64_t seed = 1;
};

struct GoldenArgs {
  enum class Action { record, check, update, trajectory, observe } action = Action::check;
  std::vector<std::filesystem::path> recipes;
  double safety_factor = 5;     // record, update: the band's factor over the measured spread
  bool variants = true;         // record, update: derive the band (false: bitwise only)
  std::filesystem::path out;    // trajectory: where to write it
  std::filesystem::path from;   // observe: the directory of trajectories (<recipe stem>.json each)
  bool gradient_noise = false;  // trajectory: with one-ulp gradient noise (golden/gradient_noise.h)
  int world_size = 1;           // record: ranks to train on (update and check read the golden file's)
};

int validate(const RecipeArgs& args);
int golden(const GoldenArgs& args);
// `source`: a finished run (its model.safetensors), a checkpoint, or a directory of checkpoints or a
// run directory without final weights (the latest complete checkpoint).
// A destination ending in .safetensors is one file (fp32 unless `dtype` says); any other is a model
// directory from_pretrained loads (in `dtype`, by default the run's precision, sharded above
// `max_shard_bytes`, with config.json and the starting directory's tokenizer files).
struct ExportArgs {
  std::filesystem::path source, destination;
  std::string dtype;                        // fp32, bf16, fp16; empty: the default above
  int64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default, "5GB"
  bool adapter = false;                     // a LoRA run's adapter alone, as PEFT writes it
};
int export_weights(const ExportArgs& args);
int checkpoint_list(const std::filesystem::path& dir);
int checkpoint_inspect(const std::filesystem::path& checkpoint);
// Exit 2 (a UserError naming every damaged file) unless every rank file matches its manifest.
int checkpoint_verify(const std::filesystem::path& checkpoint_or_dir);
// The directory holding a run's checkpoints: `path` itself, or a run directory's checkpoints/.
std::filesystem::path checkpoints_in(const std::filesystem::path& path);
int generate(const GenerateArgs& args);

// engine eval: the validation loss of weights (a run directory's final weights, a safetensors file,
// a Hugging Face model directory; default the recipe's model.init_from) over `batches` of the
// recipe's validation split (default train.eval_batches), without training.
struct EvalArgs {
  RecipeArgs recipe;
  std::filesystem::path weights;
  int64_t batches = 0;
};
int evaluate(const EvalArgs& args);
int train(const RecipeArgs& args);
int plan(const RecipeArgs& args, const FitArgs& fit = {});
// engine plan with budgets or --fit: the configurations table, and with --fit the proposal.
void print_fit(const RecipeArgs& args, const FitArgs& fit, const recipe::LoadedRecipe& loaded);
int config(const RecipeArgs& args, bool only_changed);
int schema(bool markdown);
int help(const std::string& topic);
int plugin_info(const std::filesystem::path& file);
// engine report: an HTML page of the runs' metrics (default <first run>/report.html) and a summary
// of each on stdout.
int report(const std::vector<std::filesystem::path>& run_dirs, const std::filesystem::path& output);

// Commands that run steps in one process only (generate): any other world size (--world-size, or
// mpirun's environment) is a user error, rather than N independent copies side by side. `engine
// plan` and `validate` still accept one, to size a run for N ranks.
void require_single_process(const recipe::WorldSize& world, const std::string& command);

// One line describing a loaded recipe, printed by `engine validate`.
std::string summary(const recipe::LoadedRecipe& loaded);

}  // namespace engine::cli
