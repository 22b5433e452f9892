#include "lua/params.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "recipe/suggest.h"

namespace engine::lua {

using Json = nlohmann::json;
using recipe::YamlNode;

namespace {

std::string format_number(double v) {
  if (v == std::floor(v) && std::abs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buffer[32];
  auto end = std::to_chars(buffer, buffer + sizeof buffer, v).ptr;
  return std::string(buffer, end);
}

std::optional<int64_t> parse_integer(const std::string& s) {
  int64_t value = 0;
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  auto [end, error] = std::from_chars(begin, s.data() + s.size(), value);
  if (s.empty() || error != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_number(const std::string& s) {
  double value = 0;
  const char* begin = s.data() + (!s.empty() && s[0] == '+' ? 1 : 0);
  auto [end, error] = std::from_chars(begin, s.data() + s.size(), value);
  if (s.empty() || error != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::string describe_json(const Json& value) {
  if (value.is_string()) return "\"" + value.get<std::string>() + "\"";
  if (value.is_array()) return "a list";
  if (value.is_object()) return "a map";
  return value.dump();
}

}  // namespace

Json yaml_to_json(const YamlNode& node) {
  switch (node.kind) {
    case YamlNode::Kind::Null:
      return nullptr;
    case YamlNode::Kind::Scalar: {
      if (node.quoted) return node.scalar;
      const std::string& s = node.scalar;
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
      if (auto i = parse_integer(s)) return *i;
      if (auto d = parse_number(s)) return *d;
      return s;
    }
    case YamlNode::Kind::Sequence: {
      Json array = Json::array();
      for (const auto& item : node.items) array.push_back(yaml_to_json(item));
      return array;
    }
    case YamlNode::Kind::Map: {
      Json object = Json::object();
      for (const auto& entry : node.entries) object[entry.key] = yaml_to_json(entry.value);
      return object;
    }
  }
  return nullptr;
}

PluginParam param_from_json(const Json& d) {
  PluginParam p;
  p.name = d.value("name", "");
  p.type = d.value("type", "table");
  p.help = d.value("help", "");
  if (d.contains("default")) p.default_value = d["default"];
  if (d.contains("min")) p.min = d["min"].get<double>();
  if (d.contains("max")) p.max = d["max"].get<double>();
  if (d.contains("choices"))
    for (const auto& c : d["choices"]) p.choices.push_back(c.get<std::string>());
  return p;
}

std::string param_expectation(const PluginParam& p) {
  if (!p.choices.empty()) {
    std::string list;
    for (const auto& c : p.choices) list += (list.empty() ? "" : ", ") + c;
    return "one of " + list;
  }
  std::string text = p.type == "integer"   ? "an integer"
                     : p.type == "number"  ? "a number"
                     : p.type == "string"  ? "a string"
                     : p.type == "boolean" ? "true or false"
                     : p.type == "list"    ? "a list"
                                           : "any value";
  if (p.min && p.max) return text + " in [" + format_number(*p.min) + ", " + format_number(*p.max) + "]";
  if (p.min) return text + " >= " + format_number(*p.min);
  if (p.max) return text + " <= " + format_number(*p.max);
  return text;
}

std::string check_param_value(const PluginParam& p, const Json& value) {
  bool ok = p.type == "table" || (p.type == "integer" && value.is_number_integer()) ||
            (p.type == "number" && value.is_number()) || (p.type == "string" && value.is_string()) ||
            (p.type == "boolean" && value.is_boolean()) || (p.type == "list" && value.is_array());
  if (ok && value.is_number()) {
    double v = value.get<double>();
    if ((p.min && v < *p.min) || (p.max && v > *p.max)) ok = false;
  }
  if (ok && !p.choices.empty())
    ok =
        value.is_string() && std::find(p.choices.begin(), p.choices.end(), value.get<std::string>()) != p.choices.end();
  return ok ? "" : "expected " + param_expectation(p) + ", found " + describe_json(value);
}

Json resolve_args(const PluginInfo& info, const recipe::PluginEntry& entry, const std::string& key,
                  recipe::DiagnosticSink& sink) {
  const YamlNode* node = entry.node.get();
  const YamlNode* args = node && node->is_map() ? node->find("args") : nullptr;
  if (args && args->kind == YamlNode::Kind::Null) args = nullptr;
  const recipe::Mark mark = node ? node->mark : recipe::Mark{};
  if (!info.declares_params) return args ? yaml_to_json(*args) : Json::object();

  Json resolved = Json::object();
  std::vector<std::string> names;
  for (const auto& p : info.params) names.push_back(p.name);
  if (args) {
    for (const auto& arg : args->entries) {
      const std::string path = key + ".args." + arg.key;
      auto param = std::find_if(info.params.begin(), info.params.end(), [&](auto& p) { return p.name == arg.key; });
      if (param == info.params.end()) {
        std::vector<std::string> notes;
        if (auto match = recipe::closest_match(arg.key, names))
          notes.push_back("did you mean '" + *match + "'?");
        else
          notes.push_back(names.empty() ? info.name + " declares no parameters"
                                        : "parameters of " + info.name + ": " + [&] {
                                            std::string all;
                                            for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
                                            return all;
                                          }());
        sink.error(arg.key_mark, path, "unknown plugin parameter", notes);
        continue;
      }
      Json value = yaml_to_json(arg.value);
      if (param->type == "number" && value.is_number_integer()) value = value.get<double>();
      if (param->type == "string" && !value.is_string() && arg.value.kind == YamlNode::Kind::Scalar)
        value = arg.value.scalar;  // `metric: 5` names a metric "5"
      std::string problem = check_param_value(*param, value);
      if (!problem.empty()) {
        sink.error(arg.value.mark, path, problem,
                   param->help.empty() ? std::vector<std::string>{} : std::vector<std::string>{param->help});
        continue;
      }
      resolved[arg.key] = value;
    }
  }
  for (const auto& p : info.params) {
    if (resolved.contains(p.name) || (args && args->find(p.name))) continue;
    if (p.default_value.is_null())
      sink.error(mark, key + ".args." + p.name, "missing required plugin parameter (" + param_expectation(p) + ")",
                 p.help.empty() ? std::vector<std::string>{} : std::vector<std::string>{p.help});
    else
      resolved[p.name] = p.default_value;
  }
  return resolved;
}

}  // namespace engine::lua
