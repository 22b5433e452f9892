// load_recipe: from a recipe path and overrides to a validated, fully resolved Recipe.
//
// The steps are: read the file and its bases (compose.h), apply command-line overrides, check every
// key against the schema (schema.h), fill defaults, then apply the cross-field rules (rules.h),
// which also resolve `auto` values such as the batch triad. All mistakes found are thrown together
// as one RecipeError; nothing is reported piecemeal.
//
//   LoadedRecipe loaded = load_recipe("recipes/quickstart.yaml", {.overrides = {"train.steps=50"}});
//   int64_t micro = *loaded.recipe.train.micro_batch_size;   // resolved, never auto after loading
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "recipe/diagnostic.h"
#include "recipe/recipe.h"
#include "recipe/source.h"

namespace engine::recipe {

inline constexpr int64_t kMaxWorldSize = 1 << 20;

// How many ranks the run will have, and who said so (for messages about the batch triad).
struct WorldSize {
  int64_t size = 1;
  std::string source = "the default (a single process)";
};

// OMPI_COMM_WORLD_SIZE or PMI_SIZE when launched by mpirun, else the default of one process.
WorldSize world_size_from_environment();

struct LoadOptions {
  std::vector<std::string> overrides;
  WorldSize world;
  const SourceReader* reader = nullptr;  // nullptr: the real filesystem
  bool check_files = true;               // false: do not require data files to exist (generate, export)
};

struct LoadedRecipe {
  Recipe recipe{};
  std::filesystem::path path;
  WorldSize world;
  std::map<std::string, Mark> marks;   // "train.steps" -> where it was written; only keys given
  std::set<std::string> auto_keys;     // keys whose value was `auto` (given or by default), now resolved
  Mark document;                       // the start of the recipe file
  std::vector<std::string> overrides;  // as given to load_recipe, so the recipe can be loaded again
  // Settings the rules changed without it being an error (a warmup cut to the run), one sentence
  // each, so the commands can say so rather than run with a value the user did not write.
  std::vector<std::string> notes;

  bool given(const std::string& key) const { return marks.count(key) != 0; }
};

LoadedRecipe load_recipe(const std::filesystem::path& path, const LoadOptions& options = {});

}  // namespace engine::recipe
