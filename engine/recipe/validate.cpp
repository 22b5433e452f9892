#include "recipe/validate.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "recipe/suggest.h"

namespace engine::recipe {

namespace fs = std::filesystem;

namespace {

// The one system directory scripts/setup fills (the fortunes package): the corpus of
// recipes/examples/gpt-fortunes.yaml.
constexpr const char* kFortunesDir = "/usr/share/games/fortunes/";

bool is_plain(const YamlNode& node) { return node.kind == YamlNode::Kind::Scalar && !node.quoted; }

bool looks_like_int(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i == s.size()) return false;
  return std::all_of(s.begin() + static_cast<long>(i), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::optional<double> parse_double(const std::string& s) {
  if (s.empty() || s.size() > 64) return std::nullopt;
  const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
  double value = 0;
  auto [end, error] = std::from_chars(begin, s.data() + s.size(), value);
  if (error != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

bool in_range(const KeySpec& spec, double value) {
  if (spec.minimum && (spec.exclusive_minimum ? value <= *spec.minimum : value < *spec.minimum)) return false;
  if (spec.maximum && (spec.exclusive_maximum ? value >= *spec.maximum : value > *spec.maximum)) return false;
  return true;
}

// A scalar that would be a number or boolean if it were not quoted.
std::string quoted_hint(const YamlNode& node) {
  if (node.kind == YamlNode::Kind::Scalar && node.quoted &&
      (parse_double(node.scalar) || node.scalar == "true" || node.scalar == "false"))
    return "; remove the quotes";
  return "";
}

class ValueParser {
 public:
  ValueParser(const KeySpec& spec, const YamlNode& node, std::string& error, bool check_files)
      : spec_(spec), node_(node), error_(error), check_files_(check_files) {}

  std::optional<Value> parse() {
    switch (spec_.kind) {
      case ValueKind::Bool:
        return parse_bool();
      case ValueKind::Int:
        return parse_int(node_);
      case ValueKind::Float:
        return parse_float(node_);
      case ValueKind::String:
        return parse_string();
      case ValueKind::Enum:
        return parse_enum();
      case ValueKind::Path:
        return parse_path();
      case ValueKind::IntOrAuto:
        if (node_.kind == YamlNode::Kind::Scalar && node_.scalar == "auto") return Value(std::monostate{});
        return parse_int(node_);
      case ValueKind::FloatList:
        return parse_float_list();
    }
    return std::nullopt;
  }

 private:
  std::optional<Value> fail(std::string extra = "") {
    error_ = "expected " + spec_.expectation() + ", found " + node_.describe() + extra;
    return std::nullopt;
  }

  std::optional<Value> parse_bool() {
    if (is_plain(node_)) {
      std::string s = node_.scalar;
      if (s == "true" || s == "True" || s == "TRUE") return Value(true);
      if (s == "false" || s == "False" || s == "FALSE") return Value(false);
      if (s == "yes" || s == "no" || s == "on" || s == "off" || s == "y" || s == "n")
        return fail(" (YAML 1.1 spellings are ambiguous; write true or false)");
    }
    return fail(quoted_hint(node_));
  }

  std::optional<Value> parse_int(const YamlNode& node) {
    if (!is_plain(node)) return fail(quoted_hint(node));
    const std::string& s = node.scalar;
    if (!looks_like_int(s)) {
      if (auto d = parse_double(s)) {
        std::string hint = "";
        if (*d == std::floor(*d) && std::abs(*d) < 9e18)
          hint = " (a number with a fraction or exponent; write " + std::to_string(static_cast<int64_t>(*d)) + ")";
        return fail(hint);
      }
      return fail();
    }
    int64_t value = 0;
    const char* begin = s.data() + (s[0] == '+' ? 1 : 0);
    auto [end, error] = std::from_chars(begin, s.data() + s.size(), value);
    if (error != std::errc() || end != s.data() + s.size()) return fail(" (out of the 64-bit integer range)");
    if (!in_range(spec_, static_cast<double>(value))) return fail();
    if (spec_.limit && static_cast<double>(value) > *spec_.limit)
      return fail(" (above this engine's limit of " + std::to_string(static_cast<int64_t>(*spec_.limit)) + ")");
    return Value(value);
  }

  std::optional<Value> parse_float(const YamlNode& node) {
    if (!is_plain(node)) return fail(quoted_hint(node));
    auto value = parse_double(node.scalar);
    if (!value) return fail();
    if (!in_range(spec_, *value)) return fail();
    return Value(*value);
  }

  std::optional<Value> parse_string() {
    if (node_.kind != YamlNode::Kind::Scalar) return fail();
    return Value(node_.scalar);
  }

  std::optional<Value> parse_enum() {
    if (node_.kind != YamlNode::Kind::Scalar) return fail();
    if (std::find(spec_.choices.begin(), spec_.choices.end(), node_.scalar) != spec_.choices.end())
      return Value(node_.scalar);
    auto suggestion = closest_match(node_.scalar, spec_.choices);
    return fail(suggestion ? "; did you mean '" + *suggestion + "'?" : "");
  }

  std::optional<Value> parse_path() {
    if (node_.kind != YamlNode::Kind::Scalar || node_.scalar.empty()) return fail();
    fs::path path = node_.scalar;
    bool command_line = node_.mark.origin && node_.mark.origin->name == "<command line>";
    if (path.is_relative() && !command_line && node_.mark.origin)
      path = fs::path(node_.mark.origin->name).parent_path() / path;
    path = path.lexically_normal();
    if (spec_.must_exist && check_files_) {
      std::error_code error;
      auto status = fs::status(path, error);
      std::string relative =
          command_line ? " (relative to the working directory)" : " (relative to the recipe that names it)";
      if (error || !fs::exists(status)) {
        error_ = "file not found: " + path.string() + relative;
        // The example recipes train on corpora that Debian packages install (fortunes); only those
        // are worth a hint, since scripts/setup installs nothing else under /usr/share.
        if (path.is_absolute() && path.string().rfind(kFortunesDir, 0) == 0)
          error_ += std::string("; ") + kFortunesDir +
                    " comes from the Debian package fortunes: run scripts/setup, which installs it";
        return std::nullopt;
      }
      if (fs::is_directory(status) && !spec_.directory_allowed) {
        error_ = "expected a file, found the directory " + path.string();
        return std::nullopt;
      }
    }
    return Value(path.string());
  }

  std::optional<Value> parse_float_list() {
    if (node_.kind != YamlNode::Kind::Sequence) return fail();
    if (spec_.list_length && node_.items.size() != *spec_.list_length)
      return fail(" with " + std::to_string(node_.items.size()) + " items");
    std::vector<double> values;
    for (const auto& item : node_.items) {
      auto value = is_plain(item) ? parse_double(item.scalar) : std::nullopt;
      if (!value || !in_range(spec_, *value)) {
        error_ = "expected " + spec_.expectation() + ", found " + item.describe() + " among the items";
        return std::nullopt;
      }
      values.push_back(*value);
    }
    return Value(values);
  }

  const KeySpec& spec_;
  const YamlNode& node_;
  std::string& error_;
  bool check_files_;
};

std::vector<std::string> names_of(const SectionSpec& section) {
  std::vector<std::string> names;
  for (const auto& key : section.keys) names.push_back(key.name);
  return names;
}

// "did you mean 'lr'?" from the same section, or the section that has this exact key.
std::vector<std::string> unknown_key_notes(const Schema& schema, const SectionSpec& section, const std::string& key) {
  if (auto match = closest_match(key, names_of(section)))
    return {"did you mean '" + section.name + "." + *match + "'?"};
  for (const auto& other : schema.sections())
    if (other.find(key))
      return {"'" + key + "' is a key of section '" + other.name + "': did you mean '" + other.name + "." + key + "'?"};
  std::string known;
  for (const auto& name : names_of(section)) known += (known.empty() ? "" : ", ") + name;
  return {"keys of '" + section.name + "': " + known};
}

void validate_section(const Schema& schema, const SectionSpec& section, const YamlEntry* entry, const Mark& document,
                      LoadedRecipe& out, DiagnosticSink& sink, bool check_files) {
  Mark section_mark = entry ? entry->key_mark : document;
  std::map<std::string, Value> given;
  std::map<std::string, const YamlEntry*> given_entries;
  std::set<std::string> invalid;  // given but rejected: not also "missing"

  if (entry && entry->value.kind != YamlNode::Kind::Null) {
    if (!entry->value.is_map()) {
      sink.error(entry->value.mark, section.name, "expected a map of keys, found " + entry->value.describe());
      return;
    }
    for (const auto& key_entry : entry->value.entries) {
      const KeySpec* spec = section.find(key_entry.key);
      std::string path = section.name + "." + key_entry.key;
      if (!spec) {
        sink.error(key_entry.key_mark, path, "unknown key", unknown_key_notes(schema, section, key_entry.key));
        continue;
      }
      std::string error;
      auto value = ValueParser(*spec, key_entry.value, error, check_files).parse();
      if (!value) {
        sink.error(key_entry.value.mark, path, error);
        invalid.insert(spec->name);
        continue;
      }
      given[spec->name] = *value;
      given_entries[spec->name] = &key_entry;
      out.marks[path] = key_entry.value.mark;
    }
  }

  for (const auto& spec : section.keys) {
    bool applies = true;
    std::string selector_value;
    const KeySpec* condition_of = &spec;  // conditions chain: the first one that fails is reported
    bool unknown = false;
    while (applies && condition_of->applies_when) {
      const Condition& condition = *condition_of->applies_when;
      const KeySpec* selector = section.find(condition.key);
      if (invalid.count(condition.key)) unknown = true;  // the selector's own error says enough
      auto it = given.find(condition.key);
      selector_value.clear();
      if (it != given.end())
        selector_value = std::get<std::string>(it->second);
      else if (selector && selector->default_value)
        selector_value = std::get<std::string>(*selector->default_value);
      if (unknown || selector_value.empty()) {  // selector missing or invalid: already reported
        unknown = true;
        break;
      }
      applies = std::find(condition.values.begin(), condition.values.end(), selector_value) != condition.values.end();
      if (applies) condition_of = selector;
    }
    if (unknown) continue;
    auto it = given.find(spec.name);
    if (!applies) {
      if (it != given.end()) {
        const Condition& condition = *condition_of->applies_when;
        std::string list;
        for (const auto& v : condition.values) list += (list.empty() ? "" : ", ") + v;
        sink.error(given_entries[spec.name]->key_mark, spec.path(),
                   "does not apply when " + section.name + "." + condition.key + " is " + selector_value,
                   {"it applies when " + section.name + "." + condition.key + " is " + list + "; remove it"});
        out.marks.erase(spec.path());
      }
      continue;
    }
    if (it != given.end()) {
      spec.assign(out.recipe, it->second);
      if (std::holds_alternative<std::monostate>(it->second)) out.auto_keys.insert(spec.path());
    } else if (spec.default_value) {
      spec.assign(out.recipe, *spec.default_value);
      if (std::holds_alternative<std::monostate>(*spec.default_value)) out.auto_keys.insert(spec.path());
    } else if (spec.required && !invalid.count(spec.name)) {
      sink.error(section_mark, spec.path(), "missing required key (" + spec.expectation() + ")", {spec.help});
    }
  }
}

}  // namespace

void validate_tree(const YamlNode& root, const Schema& schema, const std::vector<DeletedKey>& deleted,
                   LoadedRecipe& out, DiagnosticSink& sink, bool check_files) {
  std::vector<std::string> section_names;
  for (const auto& section : schema.sections()) section_names.push_back(section.name);
  for (const auto& list : schema.lists()) section_names.push_back(list.name);

  for (const auto& entry : root.entries) {
    if (schema.find_section(entry.key) || schema.find_list(entry.key)) continue;
    auto reserved = std::find_if(schema.reserved().begin(), schema.reserved().end(),
                                 [&](const ReservedSection& r) { return r.name == entry.key; });
    if (reserved != schema.reserved().end()) {
      sink.error(entry.key_mark, entry.key,
                 "section is reserved for " + reserved->feature + ", which this engine version does not support yet");
      continue;
    }
    std::vector<std::string> notes;
    if (auto match = closest_match(entry.key, section_names))
      notes.push_back("did you mean '" + *match + "'?");
    else if (const KeySpec* key = [&]() -> const KeySpec* {
               for (const auto& s : schema.sections())
                 if (const KeySpec* k = s.find(entry.key)) return k;
               return nullptr;
             }())
      notes.push_back("'" + entry.key + "' is a key of section '" + key->section + "': write it under " + key->section +
                      ":");
    else {
      std::string all;
      for (const auto& name : section_names) all += (all.empty() ? "" : ", ") + name;
      notes.push_back("sections: base, " + all);
    }
    sink.error(entry.key_mark, entry.key, "unknown section", notes);
  }

  for (const auto& d : deleted) {
    if (schema.find_key(d.key) || schema.find_section(d.key) || schema.find_list(d.key)) continue;
    std::vector<std::string> all_keys;
    for (const auto& section : schema.sections())
      for (const auto& key : section.keys) all_keys.push_back(key.path());
    auto match = closest_match(d.key, all_keys);
    sink.error(d.mark, d.key, "cannot delete an unknown key",
               match ? std::vector<std::string>{"did you mean '" + *match + "'?"} : std::vector<std::string>{});
  }

  for (const auto& section : schema.sections())
    validate_section(schema, section, root.find_entry(section.name), out.document, out, sink, check_files);
  for (const auto& list : schema.lists()) list.validate(root.find_entry(list.name), out, sink, check_files);
}

}  // namespace engine::recipe
