// Composition: turning a recipe file, its bases and command-line overrides into one YAML tree.
//
// A recipe may name one or more bases, relative to itself:
//
//   base: [../common/gpt-small.yaml, ../common/markov.yaml]
//   train: {steps: 500}
//
// Bases are merged in order, then the recipe on top: maps merge key by key (deep), any other
// value (scalars and lists) is replaced whole. Every value keeps the mark of the file it came
// from, so an error in a base points into the base. Cycles are reported with the whole chain.
//
// Overrides come after the recipe path on the command line: `train.steps=100` sets a key (the
// value is parsed as YAML), `~scheduler.min_lr` deletes one so its default applies. Their marks
// read `<command line>:N:C`: the N-th override, column C of that argument.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "recipe/source.h"
#include "recipe/yaml_tree.h"

namespace engine::recipe {

inline constexpr int kMaxBaseDepth = 16;
inline constexpr int kMaxBaseFiles = 64;

// Loads `path` and its bases recursively. Throws RecipeError or UserError for problems that leave
// no recipe to check; problems that do (duplicate keys) are appended to `soft_errors`.
YamlNode compose_recipe(const std::filesystem::path& path, const SourceReader& reader,
                        std::vector<Diagnostic>& soft_errors);

// Merges `top` over `bottom`: maps deep, everything else replaced.
void deep_merge(YamlNode& bottom, YamlNode top);

// A key named by a `~key` override; validation checks that the schema knows it.
struct DeletedKey {
  Mark mark;
  std::string key;
};

// Applies `key.path=value` and `~key.path` overrides in order, reporting bad ones into `sink` and
// applying the rest. Deleting a key that is not set is not an error (its default applies anyway).
std::vector<DeletedKey> apply_overrides(YamlNode& root, const std::vector<std::string>& overrides,
                                        DiagnosticSink& sink);

}  // namespace engine::recipe
