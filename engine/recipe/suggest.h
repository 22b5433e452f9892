// Did-you-mean: the closest spelling among known names, for unknown keys, sections and values.
//
//   closest_match("lerning_rate", {"lr", "learning_rate"})  ->  "learning_rate"
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace engine::recipe {

// Edit distance with adjacent transpositions (optimal string alignment), case-insensitive.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate within a distance that scales with the word's length, if any.
std::optional<std::string> closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace engine::recipe
