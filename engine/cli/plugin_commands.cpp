// `engine plugin info FILE`: what a plugin declares (description, parameters, hooks), read by
// loading it in its sandbox exactly as a run would.
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "lua/params.h"
#include "lua/plugin.h"

namespace engine::cli {

int plugin_info(const std::filesystem::path& file) {
  lua::Plugin plugin(file, file.string(), 0);
  const lua::PluginInfo& info = plugin.info();
  std::cout << file.string() << "\n";
  if (!info.description.empty()) std::cout << "  " << info.description << "\n";
  std::cout << "\nhooks:";
  if (info.hooks.empty()) std::cout << " none";
  for (lua::Hook hook : info.hooks) std::cout << " " << lua::hook_name(hook);
  std::cout << "\n";
  for (const auto& unknown : info.unknown_hooks)
    std::cout << "  warning: " << unknown << " is not a hook (a recipe naming this plugin is refused)\n";
  if (!info.declares_params) {
    std::cout << "\nparameters: none declared (args are passed as written)\n";
    return kExitOk;
  }
  std::cout << "\nparameters:\n";
  if (info.params.empty()) std::cout << "  none\n";
  for (const auto& p : info.params) {
    std::string def = p.default_value.is_null() ? "required" : "default " + p.default_value.dump();
    std::cout << "  " << std::left << std::setw(16) << p.name << " " << std::setw(28) << lua::param_expectation(p)
              << " " << def << "\n";
    if (!p.help.empty()) std::cout << "      " << p.help << "\n";
  }
  return kExitOk;
}

}  // namespace engine::cli
