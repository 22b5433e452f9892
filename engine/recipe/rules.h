// Cross-field rules: constraints between keys, and the resolution of `auto` and derived values.
//
// Each rule is a function in rules.cpp, listed once in apply_rules(). A rule reports at the mark of
// the key the user most likely has to change, and names every value involved, e.g.
//
//   recipe.yaml:14:22: error: train.global_batch_size: 64 != micro_batch_size 8 x
//     gradient_accumulation_steps 3 x world_size 2 (= 48); world_size 2 comes from --world-size
#pragma once

#include <set>
#include <string>

#include "recipe/load.h"

namespace engine::recipe {

// Runs after validate_tree(). Rules that read a section listed in `broken_sections` (one with a
// validation error) are skipped, so the errors they would find are reported with the others only
// when they are real.
void apply_rules(LoadedRecipe& loaded, DiagnosticSink& sink, const std::set<std::string>& broken_sections);

}  // namespace engine::recipe
