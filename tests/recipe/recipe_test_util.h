// Helpers for recipe tests: load recipes from an in-memory filesystem and get their diagnostics.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "recipe/load.h"

namespace engine::recipe::testing {

// A recipe that validates, to which tests add mistakes.
inline const char* kValidRecipe =
    "model:\n"
    "  arch: gpt\n"
    "  vocab_size: 64\n"
    "  context_length: 32\n"
    "  n_layer: 2\n"
    "  n_head: 2\n"
    "  n_embd: 32\n"
    "data:\n"
    "  source: synthetic_markov\n"
    "train:\n"
    "  steps: 10\n"
    "  micro_batch_size: 4\n";

struct Files {
  std::map<std::string, std::string> files;
  std::vector<std::string> overrides;
  WorldSize world;

  LoadedRecipe load(const std::string& main = "r.yaml") const {
    MemorySourceReader reader;
    for (const auto& [path, text] : files) reader.add(path, text);
    LoadOptions options;
    options.overrides = overrides;
    options.world = world;
    options.reader = &reader;
    return load_recipe(main, options);
  }

  // The diagnostics of a recipe that must fail; fails the test if it loads.
  std::vector<Diagnostic> errors(const std::string& main = "r.yaml") const {
    try {
      load(main);
    } catch (const RecipeError& e) {
      return e.diagnostics();
    }
    ADD_FAILURE() << "recipe loaded without errors";
    return {};
  }
};

inline Files recipe(std::string text) { return Files{{{"r.yaml", std::move(text)}}, {}, {}}; }

}  // namespace engine::recipe::testing
