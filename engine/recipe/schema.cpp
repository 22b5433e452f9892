#include "recipe/schema.h"

#include <charconv>

namespace engine::recipe {

std::string kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::Bool:
      return "boolean";
    case ValueKind::Int:
      return "integer";
    case ValueKind::Float:
      return "number";
    case ValueKind::String:
      return "string";
    case ValueKind::Enum:
      return "enum";
    case ValueKind::Path:
      return "path";
    case ValueKind::IntOrAuto:
      return "integer or auto";
    case ValueKind::FloatList:
      return "list of numbers";
  }
  return "?";
}

namespace {

std::string format_double(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string format_bound(double value) {
  if (value == std::floor(value) && std::abs(value) < 1e15) return std::to_string(static_cast<int64_t>(value));
  return format_double(value);
}

}  // namespace

std::string format_value(const Value& value) {
  struct Visitor {
    std::string operator()(std::monostate) const { return "auto"; }
    std::string operator()(bool v) const { return v ? "true" : "false"; }
    std::string operator()(int64_t v) const { return std::to_string(v); }
    std::string operator()(double v) const { return format_double(v); }
    std::string operator()(const std::string& v) const { return v; }
    std::string operator()(const std::vector<double>& v) const {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + format_double(v[i]);
      return out + "]";
    }
  };
  return std::visit(Visitor{}, value);
}

std::string KeySpec::expectation() const {
  std::string range;
  if (minimum && maximum) {
    range = std::string(" in ") + (exclusive_minimum ? "(" : "[") + format_bound(*minimum) + ", " +
            format_bound(*maximum) + (exclusive_maximum ? ")" : "]");
  } else if (minimum) {
    range = std::string(exclusive_minimum ? " > " : " >= ") + format_bound(*minimum);
  } else if (maximum) {
    range = std::string(exclusive_maximum ? " < " : " <= ") + format_bound(*maximum);
  }
  switch (kind) {
    case ValueKind::Bool:
      return "true or false";
    case ValueKind::Int:
      return "an integer" + range;
    case ValueKind::Float:
      return "a number" + range;
    case ValueKind::String:
      return "a string";
    case ValueKind::Path:
      return "a file path";
    case ValueKind::IntOrAuto:
      return "an integer" + range + " or auto";
    case ValueKind::FloatList:
      return "a list of " + (list_length ? std::to_string(*list_length) + " " : std::string()) + "numbers" +
             (range.empty() ? "" : ", each" + range);
    case ValueKind::Enum: {
      std::string out = "one of ";
      for (size_t i = 0; i < choices.size(); ++i) out += (i ? ", " : "") + choices[i];
      return out;
    }
  }
  return "?";
}

const KeySpec* SectionSpec::find(const std::string& key) const {
  for (const auto& spec : keys)
    if (spec.name == key) return &spec;
  return nullptr;
}

const SectionSpec* Schema::find_section(const std::string& name) const {
  for (const auto& section : sections_)
    if (section.name == name) return &section;
  return nullptr;
}

const KeySpec* Schema::find_key(const std::string& path) const {
  size_t dot = path.find('.');
  if (dot == std::string::npos) return nullptr;
  const SectionSpec* section = find_section(path.substr(0, dot));
  return section ? section->find(path.substr(dot + 1)) : nullptr;
}

}  // namespace engine::recipe
