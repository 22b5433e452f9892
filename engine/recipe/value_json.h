// A recipe value (schema.h) as JSON, in either nlohmann flavour: `auto` becomes the string "auto".
//
//   nlohmann::json j = value_json<nlohmann::json>(spec.read(recipe));
#pragma once

#include <variant>

#include "recipe/schema.h"

namespace engine::recipe {

template <class Json>
Json value_json(const Value& value) {
  struct Visitor {
    Json operator()(std::monostate) const { return "auto"; }
    Json operator()(bool v) const { return v; }
    Json operator()(int64_t v) const { return v; }
    Json operator()(double v) const { return v; }
    Json operator()(const std::string& v) const { return v; }
    Json operator()(const std::vector<double>& v) const { return v; }
  };
  return std::visit(Visitor{}, value);
}

}  // namespace engine::recipe
