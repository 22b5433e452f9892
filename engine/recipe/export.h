// Everything the schema declarations are turned into for people and tools:
//
//   engine schema                -> json_schema(): JSON Schema draft 2020-12, for editors
//                                   (schemas/recipe.schema.json is this output, checked by a test)
//   engine schema --markdown     -> markdown_reference(): docs/recipe-reference.md, checked the same way
//   engine config RECIPE [--diff] -> dump_recipe(): the resolved recipe as YAML
#pragma once

#include <string>

#include "recipe/load.h"
#include "recipe/schema.h"

namespace engine::recipe {

std::string json_schema(const Schema& schema);
std::string markdown_reference(const Schema& schema);

// Every applicable key in declaration order, with defaults and resolved `auto` values. With
// only_changed, only keys whose value differs from the declared default.
std::string dump_recipe(const LoadedRecipe& loaded, const Schema& schema, bool only_changed);

// Whether `spec` applies to the loaded recipe (its selector has one of the listed values).
bool key_applies(const KeySpec& spec, const SectionSpec& section, const Recipe& recipe);

}  // namespace engine::recipe
