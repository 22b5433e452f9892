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

struct RecipeArgs {
  std::filesystem::path recipe;
  std::vector<std::string> overrides;
  int64_t world_size = 0;  // 0: from the environment
  std::filesystem::path first_gradients;  // train: --dump-first-gradients
  // train: --dump-gradients-at STEP PATH (repeatable)
  std::vector<std::pair<int64_t, std::string>> gradients_at;

  recipe::LoadOptions load_options() const;
};

struct GenerateArgs {
  std::filesystem::path run_dir;
  std::string prompt;
  int64_t tokens = 200;
  double temperature = 0.8;
  int64_t top_k = 40;
  int64_t seed = 1;
};

struct GoldenArgs {
  enum class Action { record, check, update } action = Action::check;
  std::vector<std::filesystem::path> recipes;
  double rtol = 0, atol = 0;  // record: 0 and 0 mean the exact policy
};

int validate(const RecipeArgs& args);
int golden(const GoldenArgs& args);
int export_weights(const std::filesystem::path& run_dir, const std::filesystem::path& destination);
int generate(const GenerateArgs& args);
int train(const RecipeArgs& args);
int plan(const RecipeArgs& args);
int config(const RecipeArgs& args, bool only_changed);
int schema(bool markdown);
int help(const std::string& topic);
int plugin_info(const std::filesystem::path& file);

// One line describing a loaded recipe, printed by `engine validate`.
std::string summary(const recipe::LoadedRecipe& loaded);

}  // namespace engine::cli
