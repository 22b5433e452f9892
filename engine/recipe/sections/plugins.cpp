// `plugins:` a list of Lua plugins with their arguments. Each entry is loaded in its sandbox while
// the recipe is checked, so a broken plugin, a hook name typo or a wrong argument is a recipe error
// with the place it was written, before any model is built.
#include <yaml-cpp/emitter.h>

#include <algorithm>

#include "lua/params.h"
#include "lua/plugin.h"
#include "recipe/load.h"
#include "recipe/sections/sections.h"
#include "recipe/suggest.h"
#include "recipe/yaml_tree.h"

namespace engine::recipe {

namespace fs = std::filesystem;

namespace {

// Resolves a plugin path as paths of the recipe are: relative to the file that names it, or to the
// working directory for an override.
fs::path resolve(const YamlNode& node) {
  fs::path path = node.scalar;
  bool command_line = node.mark.origin && node.mark.origin->name == "<command line>";
  if (path.is_relative() && !command_line && node.mark.origin)
    path = fs::path(node.mark.origin->name).parent_path() / path;
  return path.lexically_normal();
}

void check_plugin(const PluginEntry& entry, const YamlNode& path_node, const std::string& key,
                  std::vector<std::string>& lr_owners, DiagnosticSink& sink) {
  std::optional<lua::PluginInfo> info;
  try {
    info = lua::Plugin(entry.path, entry.name, 0).info();
  } catch (const UserError& e) {
    sink.error(path_node.mark, key + ".path", std::string("the plugin does not load: ") + e.what());
    return;
  }
  for (const auto& unknown : info->unknown_hooks) {
    auto match = closest_match(unknown, lua::hook_names());
    std::string all;
    for (const auto& h : lua::hook_names()) all += (all.empty() ? "" : ", ") + h;
    sink.error(path_node.mark, key + ".path", entry.name + " defines " + unknown + ", which is not a hook",
               {match ? "did you mean '" + *match + "'?" : "hooks: " + all});
  }
  if (std::find(info->hooks.begin(), info->hooks.end(), lua::Hook::lr) != info->hooks.end()) {
    if (!lr_owners.empty())
      sink.error(path_node.mark, key + ".path",
                 entry.name + " defines lr, and so does " + lr_owners.front() +
                     ": only one plugin may replace the learning-rate schedule");
    lr_owners.push_back(entry.name);
  }
  lua::resolve_args(*info, entry, key, sink);
}

void validate_plugins(const YamlEntry* section, LoadedRecipe& out, DiagnosticSink& sink, bool check_files) {
  if (!section || section->value.kind == YamlNode::Kind::Null) return;
  const YamlNode& list = section->value;
  if (list.kind != YamlNode::Kind::Sequence) {
    sink.error(list.mark, "plugins",
               "expected a list of plugins ({path: FILE.lua, args: {...}} or FILE.lua), found " + list.describe());
    return;
  }
  out.marks["plugins"] = list.mark;
  std::vector<std::string> lr_owners;
  for (size_t i = 0; i < list.items.size(); ++i) {
    const YamlNode& item = list.items[i];
    const std::string key = "plugins[" + std::to_string(i) + "]";
    const YamlNode* path = nullptr;
    bool ok = true;
    if (item.kind == YamlNode::Kind::Scalar) {
      path = &item;
    } else if (item.is_map()) {
      for (const auto& field : item.entries) {
        if (field.key == "path" || field.key == "args") continue;
        auto match = closest_match(field.key, {"path", "args"});
        sink.error(field.key_mark, key + "." + field.key, "unknown key",
                   {match ? "did you mean '" + *match + "'?" : "a plugin entry has path and args"});
        ok = false;
      }
      path = item.find("path");
      if (!path) {
        sink.error(item.mark, key + ".path", "missing required key (the plugin's .lua file)");
        continue;
      }
      const YamlNode* args = item.find("args");
      if (args && args->kind != YamlNode::Kind::Null && !args->is_map()) {
        sink.error(args->mark, key + ".args", "expected a map of plugin arguments, found " + args->describe());
        ok = false;
      }
    } else {
      sink.error(item.mark, key, "expected {path: FILE.lua, args: {...}} or FILE.lua, found " + item.describe());
      continue;
    }
    if (path->kind != YamlNode::Kind::Scalar || path->scalar.empty()) {
      sink.error(path->mark, key + ".path", "expected a path to a .lua file, found " + path->describe());
      continue;
    }
    PluginEntry entry{resolve(*path), path->scalar, std::make_shared<YamlNode>(item)};
    if (check_files) {
      std::error_code error;
      auto status = fs::status(entry.path, error);
      bool command_line = path->mark.origin && path->mark.origin->name == "<command line>";
      if (error || !fs::exists(status)) {
        sink.error(
            path->mark, key + ".path",
            "file not found: " + entry.path.string() +
                (command_line ? " (relative to the working directory)" : " (relative to the recipe that names it)"));
        continue;
      }
      if (fs::is_directory(status)) {
        sink.error(path->mark, key + ".path", "expected a file, found the directory " + entry.path.string());
        continue;
      }
      if (ok) check_plugin(entry, *path, key, lr_owners, sink);
    }
    out.recipe.plugins.push_back(std::move(entry));
  }
}

void emit(YAML::Emitter& out, const YamlNode& node) {
  switch (node.kind) {
    case YamlNode::Kind::Null:
      out << YAML::Null;
      break;
    case YamlNode::Kind::Scalar:
      if (node.quoted) out << YAML::DoubleQuoted;
      out << node.scalar;
      break;
    case YamlNode::Kind::Sequence:
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : node.items) emit(out, item);
      out << YAML::EndSeq;
      break;
    case YamlNode::Kind::Map:
      out << YAML::Flow << YAML::BeginMap;
      for (const auto& entry : node.entries) {
        out << YAML::Key << entry.key << YAML::Value;
        emit(out, entry.value);
      }
      out << YAML::EndMap;
      break;
  }
}

void dump_plugins(const Recipe& recipe, YAML::Emitter& out) {
  out << YAML::BeginSeq;
  for (const auto& entry : recipe.plugins) {
    out << YAML::BeginMap << YAML::Key << "path" << YAML::Value << fs::absolute(entry.path).lexically_normal().string();
    const YamlNode* args = entry.node && entry.node->is_map() ? entry.node->find("args") : nullptr;
    if (args && args->kind != YamlNode::Kind::Null) {
      out << YAML::Key << "args" << YAML::Value;
      emit(out, *args);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

}  // namespace

void declare_plugins(Schema& schema) {
  ListSectionSpec plugins;
  plugins.name = "plugins";
  plugins.help =
      "Lua plugins that hook into training (docs/plugins.md), in the order their hooks run. Each is loaded "
      "in a sandbox when the recipe is checked; its arguments are checked against the parameters it declares "
      "(`engine plugin info FILE` lists them).";
  plugins.fields = {{"path", "string", true, "The plugin's .lua file, relative to this recipe."},
                    {"args", "object", false, "Arguments, checked against the plugin's declared parameters."}};
  plugins.shorthand = "the plugin's path, with no arguments.";
  plugins.validate = validate_plugins;
  plugins.count = [](const Recipe& recipe) { return recipe.plugins.size(); };
  plugins.dump = dump_plugins;
  schema.list_section(std::move(plugins));
}

}  // namespace engine::recipe
