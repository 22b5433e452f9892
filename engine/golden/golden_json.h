// The JSON form of a golden file (format 2). Non-finite values are strings ("nan", "inf",
// "-inf") so that their class survives the round trip; JSON has no literal for them. "world_size"
// is written only above 1, so files recorded before ranks existed read as world size 1.
#pragma once

#include <nlohmann/json.hpp>

#include "golden/golden.h"

namespace engine {

inline constexpr int kGoldenFormat = 2;

nlohmann::ordered_json golden_to_json(const GoldenFile& golden);
GoldenFile golden_from_json(const nlohmann::ordered_json& j);  // throws nlohmann::json::exception, UserError

nlohmann::ordered_json environment_to_json(const NumericEnvironment& env);
NumericEnvironment environment_from_json(const nlohmann::ordered_json& j);

}  // namespace engine
