// Checking a composed YAML tree against the schema, filling a Recipe with given and default values.
#pragma once

#include <vector>

#include "recipe/compose.h"
#include "recipe/load.h"
#include "recipe/schema.h"

namespace engine::recipe {

// Reports unknown sections and keys (with did-you-mean), type and range errors, keys that do not
// apply to the chosen variant and missing required keys into `sink`; assigns everything valid.
void validate_tree(const YamlNode& root, const Schema& schema, const std::vector<DeletedKey>& deleted,
                   LoadedRecipe& out, DiagnosticSink& sink, bool check_files = true);

}  // namespace engine::recipe
