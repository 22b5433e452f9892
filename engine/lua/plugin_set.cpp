#include <algorithm>

#include "lua/params.h"
#include "lua/plugin.h"
#include "recipe/export.h"
#include "recipe/schema.h"
#include "recipe/value_json.h"

namespace engine::lua {

using Json = nlohmann::json;

namespace {

bool is_key_name(const std::string& part) {
  return !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

std::string on_recipe_error(const std::string& plugin, const std::string& text) {
  return "plugin " + plugin + ", on_recipe: " + text;
}

std::string user_only(const std::string& key) {
  return key + " names a file or directory; only the recipe and the command line may set it";
}

// Refuses a change that could reach the file system: one to a key declared file_system, a value
// (`leaf`) in place of a whole section that holds such a key, anything under `base` or `plugins`.
// The key must be spelt as a recipe key, so that no override text (`=`, `~`, spaces) can smuggle a
// second key in.
void check_change(const std::string& path, bool leaf, const std::string& plugin) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  for (const auto& part : parts)
    if (!is_key_name(part))
      throw PluginError(on_recipe_error(plugin, "'" + path + "' is not a recipe key (section.key)"));
  if (parts[0] == "plugins")
    throw PluginError(on_recipe_error(plugin, "the plugins of a run cannot be changed by a plugin"));
  if (parts[0] == "base") throw PluginError(on_recipe_error(plugin, user_only("base")));
  const auto& schema = recipe::Schema::engine();
  const recipe::SectionSpec* section = schema.find_section(parts[0]);
  if (!section) return;  // unknown: the reload reports it with a did-you-mean
  if (parts.size() == 1) {
    if (!leaf) return;  // a table of changes to the section's keys, each checked on its own
    for (const auto& key : section->keys)
      if (key.file_system)
        throw PluginError(
            on_recipe_error(plugin, "'" + path + "' replaces the whole section, and " + user_only(key.path())));
    return;
  }
  if (const recipe::KeySpec* key = section->find(parts[1]); key && key->file_system)
    throw PluginError(on_recipe_error(plugin, user_only(key->path())));
}

void flatten(const Json& changes, const std::string& prefix, std::vector<std::string>& out, const std::string& plugin) {
  for (const auto& [key, value] : changes.items()) {
    std::string path = prefix.empty() ? key : prefix + "." + key;
    check_change(path, !value.is_object(), plugin);
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

std::vector<std::string> moved_paths(const recipe::Recipe& before, const recipe::Recipe& after) {
  std::vector<std::string> moved;
  for (const auto& section : recipe::Schema::engine().sections())
    for (const auto& key : section.keys) {
      if (!key.file_system || !recipe::key_applies(key, section, after)) continue;
      const recipe::Value old_value = key.read(before), new_value = key.read(after);
      if (old_value != new_value)
        moved.push_back(key.path() + ": '" + recipe::format_value(old_value) + "' -> '" +
                        recipe::format_value(new_value) + "'");
    }
  bool same_plugins = before.plugins.size() == after.plugins.size();
  for (size_t i = 0; same_plugins && i < before.plugins.size(); ++i)
    same_plugins = before.plugins[i].path == after.plugins[i].path;
  if (!same_plugins) moved.push_back("plugins");
  return moved;
}

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
  std::vector<std::pair<std::string, std::vector<std::string>>> changes;  // plugin, its overrides
  std::vector<std::string> overrides;
  for (auto& plugin : plugins_) {
    if (!plugin->has(Hook::on_recipe)) continue;
    auto mine = changes_to_overrides(plugin->on_recipe(values), plugin->info().name);
    for (const auto& o : mine) {
      if (applied) applied->push_back(plugin->info().name + ": " + o);
      overrides.push_back(o);
    }
    if (!mine.empty()) changes.emplace_back(plugin->info().name, std::move(mine));
  }
  if (overrides.empty()) return std::nullopt;
  auto reload = [&](const std::vector<std::string>& extra) {
    recipe::LoadOptions options;
    options.overrides = loaded.overrides;
    options.overrides.insert(options.overrides.end(), extra.begin(), extra.end());
    options.world = loaded.world;
    return recipe::load_recipe(loaded.path, options);
  };
  std::optional<recipe::LoadedRecipe> changed;
  try {
    changed = reload(overrides);
  } catch (const recipe::RecipeError& e) {
    std::string list;
    for (const auto& o : overrides) list += (list.empty() ? "" : " ") + o;
    throw PluginError("the recipe as changed by on_recipe (" + list + ") is not valid:\n" + e.what());
  }
  if (auto moved = moved_paths(loaded.recipe, changed->recipe); !moved.empty()) {
    // Name the plugin whose changes alone move a path; failing that (only the changes together
    // do), every plugin that changed the recipe.
    for (const auto& [plugin, mine] : changes) {
      std::vector<std::string> alone;
      try {
        alone = moved_paths(loaded.recipe, reload(mine).recipe);
      } catch (const recipe::RecipeError&) {
      }
      if (!alone.empty())
        throw PluginError(on_recipe_error(
            plugin, user_only(alone[0].substr(0, alone[0].find(':'))) + " (its changes moved " + alone[0] + ")"));
    }
    std::string names;
    for (const auto& [plugin, mine] : changes) names += (names.empty() ? "" : ", ") + plugin;
    throw PluginError("plugins " + names + ", on_recipe: " + user_only(moved[0].substr(0, moved[0].find(':'))) +
                      " (their changes together moved " + moved[0] + ")");
  }
  return changed;
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
