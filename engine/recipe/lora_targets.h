// LoRA's target modules: which linear layers of a GPT-2 or Llama block a recipe's
// lora.target_modules selects, by Hugging Face module names as PEFT matches them (a name selects
// every module whose path is it or ends with "." + it; all-linear selects every linear layer of the
// blocks, never the LM head).
//
//   std::string problem;
//   auto modules = lora_targets(Arch::llama, "q_proj,v_proj", &problem);
//   // {"self_attn.q_proj", "self_attn.v_proj"}
#pragma once

#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace engine::recipe {

// Every linear module of one block, as a path within the block ("attn.c_attn", "mlp.down_proj").
std::vector<std::string> lora_modules(Arch arch);
// The modules `target_modules` selects, in block order; empty with `problem` set when a name
// selects nothing or the list is empty.
std::vector<std::string> lora_targets(Arch arch, const std::string& target_modules, std::string* problem);
// The names as the recipe lists them (comma-separated, spaces trimmed).
std::vector<std::string> lora_target_names(const std::string& target_modules);

}  // namespace engine::recipe
