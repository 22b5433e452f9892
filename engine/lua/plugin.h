// Plugin: one Lua file loaded into its own sandbox (sandbox.h), and PluginSet: a recipe's plugins.
//
// A plugin is a text Lua file whose top level may declare `description` and `params`, and defines
// any of the hooks of api.h as global functions (docs/plugins.md is the reference):
//
//   description = "Stops when the validation loss stops improving."
//   params = {patience = {type = "integer", default = 5, min = 1, help = "evaluations to wait"}}
//   saved = {best = nil, bad = 0}                 -- written with checkpoints, restored on resume
//   function on_eval(state, metrics)
//     if saved.best == nil or metrics.val_loss < saved.best then saved.best, saved.bad = metrics.val_loss, 0
//     else saved.bad = saved.bad + 1 end
//     if saved.bad >= args.patience then engine.request_stop("no improvement") end
//   end
//
// The host side:
//
//   PluginSet plugins = PluginSet::from_recipe(loaded);        // loads, validates args
//   PluginActions a = plugins.on_step_end(state, metrics);     // every plugin, in recipe order
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "lua/api.h"
#include "recipe/load.h"

namespace engine::lua {

class Sandbox;

// One declared parameter: `params = {name = {type = ..., default = ..., min, max, choices, help}}`.
struct PluginParam {
  std::string name;
  std::string type;              // integer, number, string, boolean, list, table
  nlohmann::json default_value;  // null: the recipe must give it
  std::optional<double> min, max;
  std::vector<std::string> choices;
  std::string help;
};

struct PluginInfo {
  std::string name;  // as the recipe (or command line) wrote the path
  std::string description;
  std::vector<Hook> hooks;                 // defined, in api.h order
  bool declares_params = false;            // false: arguments are passed through as written
  std::vector<PluginParam> params;         // by name
  std::vector<std::string> unknown_hooks;  // functions named like hooks that are not hooks
};

class Plugin {
 public:
  // Reads the file and runs its top level. Throws PluginError (syntax or runtime errors, limits)
  // or UserError (unreadable file).
  Plugin(const std::filesystem::path& path, std::string name, uint64_t seed, Limits limits = {});
  ~Plugin();

  const PluginInfo& info() const { return info_; }
  bool has(Hook hook) const;

  // Sets the global `args` (validated values, params.h) and `state.recipe` before any hook runs.
  void start(const nlohmann::json& args, const nlohmann::json& recipe_values);

  // on_recipe(recipe): the changes the hook returns (a table, nested or with dotted keys), or null.
  nlohmann::json on_recipe(const nlohmann::json& recipe);
  PluginActions on_train_start(const TrainState& state);
  PluginActions on_step_start(const TrainState& state);
  // lr(step, base_lr, state): the learning rate of the update in progress (step is 0-based).
  double lr(int64_t step, double base_lr, const TrainState& state, PluginActions& actions);
  PluginActions on_step_end(const TrainState& state, const Metrics& metrics);
  PluginActions on_eval(const TrainState& state, const Metrics& metrics);
  PluginActions on_checkpoint(const TrainState& state, const std::string& path);
  PluginActions on_anomaly(const TrainState& state, const AnomalyEvent& event);
  PluginActions on_train_end(const TrainState& state, const Metrics& summary);

  // The global table `saved` as JSON (null when the plugin keeps none), and back.
  nlohmann::json save_state();
  void restore_state(const nlohmann::json& saved);

 private:
  struct Call;
  PluginActions invoke(Hook hook, const TrainState& state, std::shared_ptr<const Call> call);

  std::unique_ptr<Sandbox> sandbox_;
  uint64_t seed_ = 0;
  PluginInfo info_;
};

class PluginSet {
 public:
  PluginSet() = default;
  // The recipe's plugins, loaded and started with their validated arguments and the recipe's values.
  // Throws RecipeError for arguments that do not match the declared parameters.
  static PluginSet from_recipe(const recipe::LoadedRecipe& loaded);

  bool empty() const { return plugins_.empty(); }
  size_t size() const { return plugins_.size(); }
  Plugin& operator[](size_t i) { return *plugins_[i]; }
  bool has(Hook hook) const;

  // Runs every plugin's on_recipe on the resolved recipe and reloads it with the changes as
  // overrides, so the result is validated like any recipe; a change that moves a path is a
  // PluginError naming the plugin and the key. Returns nullopt when nothing changed;
  // `applied` receives "plugin: override" for each change, for the log.
  std::optional<recipe::LoadedRecipe> apply_on_recipe(const recipe::LoadedRecipe& loaded,
                                                      std::vector<std::string>* applied = nullptr);
  // Updates state.recipe after on_recipe changed the recipe.
  void set_recipe(const recipe::LoadedRecipe& loaded);

  PluginActions on_train_start(const TrainState& state);
  PluginActions on_step_start(const TrainState& state);
  // The plugin that defines lr, or nullopt when none does (the recipe's schedule applies).
  std::optional<double> lr(int64_t step, double base_lr, const TrainState& state, PluginActions& actions);
  PluginActions on_step_end(const TrainState& state, const Metrics& metrics);
  PluginActions on_eval(const TrainState& state, const Metrics& metrics);
  PluginActions on_checkpoint(const TrainState& state, const std::string& path);
  PluginActions on_anomaly(const TrainState& state, const AnomalyEvent& event);
  PluginActions on_train_end(const TrainState& state, const Metrics& summary);

  // {"plugins/x.lua": saved, ...} for checkpoints, and back.
  nlohmann::json save_state();
  void restore_state(const nlohmann::json& saved);

 private:
  std::vector<std::unique_ptr<Plugin>> plugins_;
  std::vector<nlohmann::json> args_;
};

// The resolved recipe as JSON: {section: {key: value}} plus `plugins`, for on_recipe and state.recipe.
nlohmann::json recipe_values(const recipe::LoadedRecipe& loaded);

// Turns on_recipe's changes into `section.key=value` overrides. Throws PluginError naming `plugin`
// and the key for changes that are not a table of recipe values, and for changes that could reach
// the file system: a key declared file_system (recipe/schema.h: run.output_dir, data.path,
// model.init_from ...), a whole section holding one, `base` or `plugins`. Paths belong to the user.
std::vector<std::string> changes_to_overrides(const nlohmann::json& changes, const std::string& plugin);

// The file_system keys that apply in `after` and the plugin paths whose values differ between the
// two recipes, as "run.output_dir: 'runs' -> '/tmp/x'". apply_on_recipe's last line of defence
// behind changes_to_overrides: whatever route a change took (a rule that derives one key from
// another, say), a plugin does not move a path.
std::vector<std::string> moved_paths(const recipe::Recipe& before, const recipe::Recipe& after);

}  // namespace engine::lua
