// Cross-field rules: constraints between keys, and the resolution of `auto` and derived values.
//
// Each rule is a function in rules.cpp, listed once in apply_rules(). A rule reports at the mark of
// the key the user most likely has to change, and names every value involved, e.g.
//
//   recipe.yaml:14:22: error: train.global_batch_size: 64 != micro_batch_size 8 x
//     gradient_accumulation_steps 3 x world_size 2 (= 48); world_size 2 comes from --world-size
#pragma once

#include "recipe/load.h"

namespace engine::recipe {

// Runs after validate_tree() succeeded: every applicable key holds a typed value.
void apply_rules(LoadedRecipe& loaded, DiagnosticSink& sink);

}  // namespace engine::recipe
