// Plugin parameters: checking the `args:` a recipe gives a plugin against what the plugin declares.
//
//   params = {patience = {type = "integer", default = 5, min = 1}}      -- in the plugin
//   plugins: [{path: plugins/early_stopping.lua, args: {patience: 0}}]   # in the recipe
//   -> r.yaml:1:62: error: plugins[0].args.patience: expected an integer >= 1, found 0
//
// Types: integer, number, string, boolean, list (a YAML list) and table (anything). A parameter
// without a default is required. A plugin that declares no `params` gets its args as written.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "lua/plugin.h"
#include "recipe/diagnostic.h"
#include "recipe/yaml_tree.h"

namespace engine::lua {

PluginParam param_from_json(const nlohmann::json& declaration);
// "an integer >= 1", "one of val_loss, loss"
std::string param_expectation(const PluginParam& param);
// Empty when `value` suits `param`, else what is wrong.
std::string check_param_value(const PluginParam& param, const nlohmann::json& value);

// The plugin's arguments with defaults filled in. Mistakes go to `sink` with the mark of the
// offending text and the key path (`plugins[0].args.patience`).
nlohmann::json resolve_args(const PluginInfo& info, const recipe::PluginEntry& entry, const std::string& key,
                            recipe::DiagnosticSink& sink);

// A YAML value as JSON, scalars typed as YAML would (plain 5 is an integer, "5" a string).
nlohmann::json yaml_to_json(const recipe::YamlNode& node);

}  // namespace engine::lua
