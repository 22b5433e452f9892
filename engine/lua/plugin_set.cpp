#include <algorithm>

#include "lua/params.h"
#include "lua/plugin.h"
#include "recipe/export.h"
#include "recipe/schema.h"
#include "recipe/value_json.h"

namespace engine::lua {

using Json = nlohmann::json;

namespace {

void flatten(const Json& changes, const std::string& prefix, std::vector<std::string>& out, const std::string& plugin) {
  for (const auto& [key, value] : changes.items()) {
    std::string path = prefix.empty() ? key : prefix + "." + key;
    if (path == "plugins" || path.rfind("plugins.", 0) == 0)
      throw PluginError("plugin " + plugin + ", on_recipe: the plugins of a run cannot be changed by a plugin");
    if (value.is_object()) {
      flatten(value, path, out, plugin);
    } else if (value.is_string()) {
      out.push_back(path + "=" + value.dump());  // JSON's quoting is YAML's double-quoted style
    } else if (value.is_null()) {
      out.push_back("~" + path);
    } else {
      out.push_back(path + "=" + value.dump());
    }
  }
}

}  // namespace

Json recipe_values(const recipe::LoadedRecipe& loaded) {
  Json values = Json::object();
  for (const auto& section : recipe::Schema::engine().sections()) {
    Json keys = Json::object();
    for (const auto& spec : section.keys)
      if (recipe::key_applies(spec, section, loaded.recipe))
        keys[spec.name] = recipe::value_json<Json>(spec.read(loaded.recipe));
    values[section.name] = keys;
  }
  Json plugins = Json::array();
  for (const auto& entry : loaded.recipe.plugins) plugins.push_back(entry.name);
  values["plugins"] = plugins;
  return values;
}

std::vector<std::string> changes_to_overrides(const Json& changes, const std::string& plugin) {
  std::vector<std::string> out;
  if (changes.is_null()) return out;
  if (!changes.is_object())
    throw PluginError("plugin " + plugin + ", on_recipe: return a table of changes such as {train = {steps = 100}}");
  flatten(changes, "", out, plugin);
  return out;
}

PluginSet PluginSet::from_recipe(const recipe::LoadedRecipe& loaded) {
  PluginSet set;
  const Json values = recipe_values(loaded);
  recipe::DiagnosticSink sink;
  for (size_t i = 0; i < loaded.recipe.plugins.size(); ++i) {
    const auto& entry = loaded.recipe.plugins[i];
    auto plugin = std::make_unique<Plugin>(entry.path, entry.name, uint64_t(loaded.recipe.run.seed));
    Json args = resolve_args(plugin->info(), entry, "plugins[" + std::to_string(i) + "]", sink);
    set.plugins_.push_back(std::move(plugin));
    set.args_.push_back(std::move(args));
  }
  sink.throw_if_any();
  for (size_t i = 0; i < set.plugins_.size(); ++i) set.plugins_[i]->start(set.args_[i], values);
  return set;
}

bool PluginSet::has(Hook hook) const {
  return std::any_of(plugins_.begin(), plugins_.end(), [&](const auto& p) { return p->has(hook); });
}

std::optional<recipe::LoadedRecipe> PluginSet::apply_on_recipe(const recipe::LoadedRecipe& loaded,
                                                               std::vector<std::string>* applied) {
  const Json values = recipe_values(loaded);
  std::vector<std::string> overrides;
  for (auto& plugin : plugins_) {
    if (!plugin->has(Hook::on_recipe)) continue;
    for (auto& o : changes_to_overrides(plugin->on_recipe(values), plugin->info().name)) {
      if (applied) applied->push_back(plugin->info().name + ": " + o);
      overrides.push_back(std::move(o));
    }
  }
  if (overrides.empty()) return std::nullopt;
  recipe::LoadOptions options;
  options.overrides = loaded.overrides;
  options.overrides.insert(options.overrides.end(), overrides.begin(), overrides.end());
  options.world = loaded.world;
  try {
    return recipe::load_recipe(loaded.path, options);
  } catch (const recipe::RecipeError& e) {
    std::string list;
    for (const auto& o : overrides) list += (list.empty() ? "" : " ") + o;
    throw PluginError("the recipe as changed by on_recipe (" + list + ") is not valid:\n" + e.what());
  }
}

void PluginSet::set_recipe(const recipe::LoadedRecipe& loaded) {
  const Json values = recipe_values(loaded);
  for (size_t i = 0; i < plugins_.size(); ++i) plugins_[i]->start(args_[i], values);
}

std::optional<double> PluginSet::lr(int64_t step, double base_lr, const TrainState& state, PluginActions& actions) {
  for (auto& plugin : plugins_)
    if (plugin->has(Hook::lr)) return plugin->lr(step, base_lr, state, actions);
  return std::nullopt;
}

#define ENGINE_DISPATCH(NAME, PARAMS, ARGS)                          \
  PluginActions PluginSet::NAME PARAMS {                             \
    PluginActions actions;                                           \
    for (auto& plugin : plugins_)                                    \
      if (plugin->has(Hook::NAME)) actions.merge(plugin->NAME ARGS); \
    return actions;                                                  \
  }
ENGINE_DISPATCH(on_train_start, (const TrainState& state), (state))
ENGINE_DISPATCH(on_step_start, (const TrainState& state), (state))
ENGINE_DISPATCH(on_step_end, (const TrainState& state, const Metrics& metrics), (state, metrics))
ENGINE_DISPATCH(on_eval, (const TrainState& state, const Metrics& metrics), (state, metrics))
ENGINE_DISPATCH(on_checkpoint, (const TrainState& state, const std::string& path), (state, path))
ENGINE_DISPATCH(on_anomaly, (const TrainState& state, const AnomalyEvent& event), (state, event))
ENGINE_DISPATCH(on_train_end, (const TrainState& state, const Metrics& summary), (state, summary))
#undef ENGINE_DISPATCH

Json PluginSet::save_state() {
  Json saved = Json::object();
  for (auto& plugin : plugins_) saved[plugin->info().name] = plugin->save_state();
  return saved;
}

void PluginSet::restore_state(const Json& saved) {
  for (auto& plugin : plugins_)
    if (saved.contains(plugin->info().name)) plugin->restore_state(saved[plugin->info().name]);
}

}  // namespace engine::lua
