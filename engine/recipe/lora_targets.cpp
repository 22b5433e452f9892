#include "recipe/lora_targets.h"

#include <algorithm>

namespace engine::recipe {

std::vector<std::string> lora_modules(Arch arch) {
  if (arch == Arch::gpt) return {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
  if (arch == Arch::llama)
    return {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
            "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
  return {};
}

std::vector<std::string> lora_target_names(const std::string& target_modules) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= target_modules.size()) {
    size_t end = target_modules.find(',', start);
    if (end == std::string::npos) end = target_modules.size();
    std::string name = target_modules.substr(start, end - start);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (!name.empty()) names.push_back(name);
    start = end + 1;
  }
  return names;
}

std::vector<std::string> lora_targets(Arch arch, const std::string& target_modules, std::string* problem) {
  const std::vector<std::string> modules = lora_modules(arch);
  const std::vector<std::string> names = lora_target_names(target_modules);
  auto fail = [&](std::string message) {
    std::string known;
    for (const std::string& m : modules) known += (known.empty() ? "" : ", ") + m.substr(m.find('.') + 1);
    *problem = std::move(message) + " (this model's linear layers: " + known + ", or all-linear)";
    return std::vector<std::string>{};
  };
  if (names.empty()) return fail("lora.target_modules names no module");
  std::vector<bool> selected(modules.size(), false);
  for (const std::string& name : names) {
    bool any = false;
    for (size_t i = 0; i < modules.size(); ++i) {
      const std::string& m = modules[i];
      const bool match = name == "all-linear" || m == name || m.ends_with("." + name);
      if (match) selected[i] = any = true;
    }
    if (!any) return fail("'" + name + "' is no linear layer of this model's blocks");
  }
  std::vector<std::string> targets;
  for (size_t i = 0; i < modules.size(); ++i)
    if (selected[i]) targets.push_back(modules[i]);
  return targets;
}

}  // namespace engine::recipe
