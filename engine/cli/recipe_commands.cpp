#include <iostream>

#include "cli/commands.h"
#include "core/error.h"
#include "recipe/export.h"

namespace engine::cli {

using namespace engine::recipe;

LoadOptions RecipeArgs::load_options() const {
  LoadOptions options;
  options.overrides = overrides;
  options.world =
      world_size > 0 ? WorldSize{world_size, "--world-size on the command line"} : world_size_from_environment();
  return options;
}

void require_single_process(const WorldSize& world, const std::string& command) {
  if (world.size == 1) return;
  const std::string n = std::to_string(world.size);
  throw UserError("engine " + command + " runs in a single process, not at world size " + n + " (from " + world.source +
                  "); run it without mpirun and without --world-size (`engine train` trains on " + n +
                  " ranks under mpirun, and `engine plan --world-size " + n + "` sizes such a run)");
}

namespace {

// "2 ranks)", or with tensor or pipeline parallelism "2 data-parallel ranks, each of 2 tensor-parallel)".
std::string ranks_text(const LoadedRecipe& loaded) {
  const DistributedSection& d = loaded.recipe.distributed;
  const int64_t model_ranks = d.tensor_parallel * d.pipeline_parallel;
  if (model_ranks == 1) return std::to_string(loaded.world.size) + (loaded.world.size == 1 ? " rank)" : " ranks)");
  const int64_t data = std::max<int64_t>(1, loaded.world.size / model_ranks);
  std::string each;
  if (d.tensor_parallel > 1) each = std::to_string(d.tensor_parallel) + " tensor-parallel";
  if (d.pipeline_parallel > 1)
    each += (each.empty() ? "" : " x ") + std::to_string(d.pipeline_parallel) + " pipeline stages";
  return std::to_string(data) + (data == 1 ? " data-parallel rank" : " data-parallel ranks") + ", each of " + each +
         ")";
}

}  // namespace

std::string summary(const LoadedRecipe& loaded) {
  const Recipe& r = loaded.recipe;
  const SectionSpec* model = Schema::engine().find_section("model");
  const SectionSpec* data = Schema::engine().find_section("data");
  std::string arch = std::get<std::string>(model->find("arch")->read(r));
  std::string source = std::get<std::string>(data->find("source")->read(r));
  std::string shape = r.model.arch == Arch::mlp
                          ? std::to_string(r.model.n_layer) + " hidden layers of " + std::to_string(r.model.hidden_dim)
                          : std::to_string(r.model.n_layer) + " layers, n_embd " + std::to_string(r.model.n_embd) +
                                ", " + std::to_string(r.model.n_head) + " heads";
  const auto& t = r.train;
  std::string line = loaded.path.string() + ": ok: " + arch + " (" + shape + ") on " + source + ", " +
                     std::to_string(t.steps) + " steps of " + std::to_string(*t.global_batch_size) +
                     " samples (micro-batch " + std::to_string(*t.micro_batch_size) + " x " +
                     std::to_string(*t.gradient_accumulation_steps) + " accumulation x " + ranks_text(loaded);
  for (const std::string& note : loaded.notes) line += "\n" + loaded.path.string() + ": note: " + note;
  return line;
}

int validate(const RecipeArgs& args) {
  LoadedRecipe loaded = load_recipe(args.recipe, args.load_options());
  std::cout << summary(loaded) << "\n";
  return kExitOk;
}

int config(const RecipeArgs& args, bool only_changed) {
  LoadedRecipe loaded = load_recipe(args.recipe, args.load_options());
  std::cout << dump_recipe(loaded, Schema::engine(), only_changed);
  return kExitOk;
}

int schema(bool markdown) {
  std::cout << (markdown ? markdown_reference(Schema::engine()) : json_schema(Schema::engine()));
  return kExitOk;
}

}  // namespace engine::cli
