// Schema: every recipe key, declared once.
//
// A declaration gives a key its type (taken from the struct field it binds to), default,
// allowed values or range, unit, help text and, for keys that only make sense for some variants,
// the sibling enum that selects them. Parsing, validation, defaults, `engine config`,
// `engine schema` (JSON Schema), docs/recipe-reference.md and `engine help <key>` all read the
// same declarations. A new feature adds a section file and one line in sections/sections.cpp:
//
//   void declare_train(Schema& schema) {
//     auto train = schema.section("train", &Recipe::train, "The training loop.");
//     train.key("steps", &TrainSection::steps).required().min(1).unit("steps")
//         .help("Optimizer steps to run.");
//     train.key("log_every", &TrainSection::log_every).def(10).min(1).unit("steps")
//         .help("Print and record metrics every this many steps.");
//   }
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "recipe/recipe.h"

namespace YAML {
class Emitter;
}

namespace engine::recipe {

struct YamlEntry;
struct LoadedRecipe;
class DiagnosticSink;

enum class ValueKind { Bool, Int, Float, String, Enum, Path, IntOrAuto, FloatList };

// A parsed key value. std::monostate stands for `auto`.
using Value = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<double>>;

std::string kind_name(ValueKind kind);         // "integer", "number", "integer or auto", ...
std::string format_value(const Value& value);  // YAML spelling: 8, 0.0003, auto, [0.9, 0.95]

// The key applies only when a sibling enum key has one of these values.
struct Condition {
  std::string key;                  // sibling key name, e.g. "arch"
  std::vector<std::string> values;  // e.g. {"gpt", "llama"}
};

struct KeySpec {
  std::string section;
  std::string name;
  ValueKind kind = ValueKind::String;
  std::string help;
  std::string unit;
  std::optional<Value> default_value;
  std::string default_note;  // for derived defaults: "the recipe file's name"
  bool required = false;
  std::optional<double> minimum;
  std::optional<double> maximum;
  bool exclusive_minimum = false;
  bool exclusive_maximum = false;
  std::optional<double> limit;        // a sanity bound (against overflow), not part of the documented range
  std::vector<std::string> choices;   // Enum
  std::optional<size_t> list_length;  // FloatList
  bool must_exist = false;            // Path: the file must exist when the recipe is loaded
  bool directory_allowed = false;     // Path: a directory is accepted too (must_exist)
  // The value names a file or directory the engine reads or writes (every Path key, and strings
  // declared with file_system()). Such keys belong to the user: only the recipe and the command
  // line set them, never a plugin's on_recipe.
  bool file_system = false;
  std::optional<Condition> applies_when;

  std::function<void(Recipe&, const Value&)> assign;
  std::function<Value(const Recipe&)> read;

  std::string path() const { return section + "." + name; }
  // "an integer >= 1", "one of gpt, llama, mlp", "a number in [0, 1)"
  std::string expectation() const;
};

struct SectionSpec {
  std::string name;
  std::string help;
  std::deque<KeySpec> keys;  // a deque: declarations hold references while more keys are added

  const KeySpec* find(const std::string& key) const;
};

// A section name kept for a feature that is planned but not built: using it is an error that
// says so, instead of an "unknown section" or, worse, silent acceptance.
struct ReservedSection {
  std::string name;
  std::string feature;
};

// A section that is a list of entries instead of a map of scalar keys (`plugins:`). Its own
// functions check and fill it and write it back; `fields` describe an entry for the JSON Schema and
// the reference, and an entry may also be written as a bare string (`shorthand`).
struct ListSectionSpec {
  struct Field {
    std::string name;
    std::string json_type;  // "string" or "object"
    bool required = false;
    std::string help;
  };
  std::string name;
  std::string help;
  std::vector<Field> fields;
  std::string shorthand;  // what a bare string entry means; empty: not allowed
  // `entry` is null when the recipe has no such section. Errors go to `sink`.
  std::function<void(const YamlEntry* entry, LoadedRecipe& out, DiagnosticSink& sink, bool check_files)> validate;
  std::function<size_t(const Recipe& recipe)> count;  // entries in a loaded recipe
  // Writes the section's value (after its key) for `engine config`, when count() > 0.
  std::function<void(const Recipe& recipe, YAML::Emitter& out)> dump;
};

template <class Field>
class KeyDecl;
template <class Section>
class SectionDecl;

class Schema {
 public:
  // The engine's schema: all sections of sections/sections.cpp.
  static const Schema& engine();

  template <class Section>
  SectionDecl<Section> section(std::string name, Section Recipe::*member, std::string help);
  void reserve(std::string name, std::string feature) { reserved_.push_back({std::move(name), std::move(feature)}); }
  void list_section(ListSectionSpec spec) { lists_.push_back(std::move(spec)); }

  const std::deque<SectionSpec>& sections() const { return sections_; }
  const std::vector<ReservedSection>& reserved() const { return reserved_; }
  const std::deque<ListSectionSpec>& lists() const { return lists_; }
  const ListSectionSpec* find_list(const std::string& name) const {
    for (const auto& list : lists_)
      if (list.name == name) return &list;
    return nullptr;
  }
  const SectionSpec* find_section(const std::string& name) const;
  const KeySpec* find_key(const std::string& path) const;  // "train.steps"

 private:
  std::deque<SectionSpec> sections_;
  std::vector<ReservedSection> reserved_;
  std::deque<ListSectionSpec> lists_;
};

// ---- binding a C++ field type to a value kind ----

template <class T>
struct FieldTraits;

template <>
struct FieldTraits<bool> {
  static constexpr ValueKind kind = ValueKind::Bool;
  static Value to_value(bool v) { return v; }
  static bool from_value(const Value& v) { return std::get<bool>(v); }
};
template <>
struct FieldTraits<int64_t> {
  static constexpr ValueKind kind = ValueKind::Int;
  static Value to_value(int64_t v) { return v; }
  static int64_t from_value(const Value& v) { return std::get<int64_t>(v); }
};
template <>
struct FieldTraits<double> {
  static constexpr ValueKind kind = ValueKind::Float;
  static Value to_value(double v) { return v; }
  static double from_value(const Value& v) { return std::get<double>(v); }
};
template <>
struct FieldTraits<std::string> {
  static constexpr ValueKind kind = ValueKind::String;
  static Value to_value(const std::string& v) { return v; }
  static std::string from_value(const Value& v) { return std::get<std::string>(v); }
};
template <>
struct FieldTraits<std::filesystem::path> {
  static constexpr ValueKind kind = ValueKind::Path;
  static Value to_value(const std::filesystem::path& v) { return v.string(); }
  static std::filesystem::path from_value(const Value& v) { return std::get<std::string>(v); }
};
template <>
struct FieldTraits<std::optional<int64_t>> {
  static constexpr ValueKind kind = ValueKind::IntOrAuto;
  static Value to_value(const std::optional<int64_t>& v) { return v ? Value(*v) : Value(std::monostate{}); }
  static std::optional<int64_t> from_value(const Value& v) {
    if (std::holds_alternative<std::monostate>(v)) return std::nullopt;
    return std::get<int64_t>(v);
  }
};
template <>
struct FieldTraits<std::vector<double>> {
  static constexpr ValueKind kind = ValueKind::FloatList;
  static Value to_value(const std::vector<double>& v) { return v; }
  static std::vector<double> from_value(const Value& v) { return std::get<std::vector<double>>(v); }
};

// Fluent declaration of one key; the setters return *this. For enum fields, call choices()
// before def().
template <class Field>
class KeyDecl {
 public:
  explicit KeyDecl(KeySpec& spec) : spec_(spec) {}

  KeyDecl& help(std::string text) {
    spec_.help = std::move(text);
    return *this;
  }
  KeyDecl& unit(std::string text) {
    spec_.unit = std::move(text);
    return *this;
  }
  KeyDecl& required() {
    spec_.required = true;
    return *this;
  }
  KeyDecl& min(double value) {
    spec_.minimum = value;
    return *this;
  }
  KeyDecl& max(double value) {
    spec_.maximum = value;
    return *this;
  }
  KeyDecl& above(double value) {
    spec_.minimum = value;
    spec_.exclusive_minimum = true;
    return *this;
  }
  KeyDecl& below(double value) {
    spec_.maximum = value;
    spec_.exclusive_maximum = true;
    return *this;
  }
  KeyDecl& limit(double value) {
    spec_.limit = value;
    return *this;
  }
  KeyDecl& length(size_t n) {
    spec_.list_length = n;
    return *this;
  }
  KeyDecl& must_exist() {
    spec_.must_exist = true;
    return *this;
  }
  // Accepts a directory where a file is expected (a model directory for model.init_from).
  KeyDecl& or_directory() {
    spec_.directory_allowed = true;
    return *this;
  }
  // For a string that becomes part of a path (a directory, a file name); Path keys are already.
  KeyDecl& file_system() {
    spec_.file_system = true;
    return *this;
  }
  KeyDecl& only_when(std::string key, std::vector<std::string> values) {
    spec_.applies_when = Condition{std::move(key), std::move(values)};
    return *this;
  }
  // A default computed by a rule at load time, described for the docs.
  KeyDecl& derived_default(std::string note) {
    spec_.default_note = std::move(note);
    return *this;
  }
  KeyDecl& auto_default(std::string note) {
    spec_.default_value = Value(std::monostate{});
    spec_.default_note = std::move(note);
    return *this;
  }

  template <class T>
  KeyDecl& def(const T& value) {
    if constexpr (std::is_enum_v<Field>) {
      spec_.default_value = Value(std::string(enum_name(static_cast<Field>(value))));
    } else {
      spec_.default_value = FieldTraits<Field>::to_value(Field(value));
    }
    return *this;
  }

  // Enum keys: the spelling of each value in recipes.
  KeyDecl& choices(std::vector<std::pair<std::string, Field>> table) requires std::is_enum_v<Field> {
    *table_ = std::move(table);  // filled in place: the key's assign/read share this table
    spec_.choices.clear();
    for (const auto& [name, value] : *table_) spec_.choices.push_back(name);
    return *this;
  }

  std::shared_ptr<std::vector<std::pair<std::string, Field>>> table_;

 private:
  const char* enum_name(Field value) const {
    for (const auto& [name, v] : *table_)
      if (v == value) return name.c_str();
    return "?";
  }

  KeySpec& spec_;
};

template <class Section>
class SectionDecl {
 public:
  SectionDecl(SectionSpec& spec, Section Recipe::*member) : spec_(spec), member_(member) {}

  template <class Field>
  KeyDecl<Field> key(std::string name, Field Section::*field) {
    spec_.keys.push_back(KeySpec{});
    KeySpec& key = spec_.keys.back();
    key.section = spec_.name;
    key.name = std::move(name);
    auto member = member_;
    if constexpr (std::is_enum_v<Field>) {
      key.kind = ValueKind::Enum;
      KeyDecl<Field> decl(key);
      decl.table_ = std::make_shared<std::vector<std::pair<std::string, Field>>>();
      auto table = decl.table_;
      key.assign = [member, field, table](Recipe& recipe, const Value& value) {
        const auto& chosen = std::get<std::string>(value);
        for (const auto& [spelling, v] : *table)
          if (spelling == chosen) (recipe.*member).*field = v;
      };
      key.read = [member, field, table](const Recipe& recipe) -> Value {
        for (const auto& [spelling, v] : *table)
          if (v == (recipe.*member).*field) return spelling;
        return std::string("?");
      };
      return decl;
    } else {
      key.kind = FieldTraits<Field>::kind;
      key.file_system = key.kind == ValueKind::Path;
      key.assign = [member, field](Recipe& recipe, const Value& value) {
        (recipe.*member).*field = FieldTraits<Field>::from_value(value);
      };
      key.read = [member, field](const Recipe& recipe) -> Value {
        return FieldTraits<Field>::to_value((recipe.*member).*field);
      };
      return KeyDecl<Field>(key);
    }
  }

 private:
  SectionSpec& spec_;
  Section Recipe::*member_;
};

template <class Section>
SectionDecl<Section> Schema::section(std::string name, Section Recipe::*member, std::string help) {
  sections_.push_back(SectionSpec{std::move(name), std::move(help), {}});
  return SectionDecl<Section>(sections_.back(), member);
}

}  // namespace engine::recipe
