// YamlNode: a YAML document as a plain tree that remembers where every value was written.
//
// yaml-cpp's own Node API silently keeps the last of two duplicate keys, shares aliased subtrees
// (so an "alias bomb" explodes only later, when someone walks it) and recurses without bound in
// some paths. The recipe loader therefore builds its own tree from yaml-cpp's event stream and
// enforces limits while doing so: duplicate keys, nesting depth, total node count after alias
// expansion, one document per file. Scalars keep whether they were quoted, so `name: "5"` is a
// string and `steps: "5"` is a type error.
//
//   YamlNode root = parse_yaml(text, origin, ParseLimits{});   // throws RecipeError
//   if (const YamlNode* steps = root.find("train")) ...
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/diagnostic.h"

namespace engine::recipe {

struct YamlEntry;

struct YamlNode {
  enum class Kind { Null, Scalar, Sequence, Map };

  Kind kind = Kind::Null;
  Mark mark;
  std::string scalar;              // Kind::Scalar
  bool quoted = false;             // written quoted, as a block scalar, or tagged !!str
  std::vector<YamlNode> items;     // Kind::Sequence
  std::vector<YamlEntry> entries;  // Kind::Map, in document order, keys unique

  bool is_map() const { return kind == Kind::Map; }
  const YamlNode* find(std::string_view key) const;
  YamlNode* find(std::string_view key);
  const YamlEntry* find_entry(std::string_view key) const;
  // Replaces the value of `key` (keeping its position) or appends it.
  void set(std::string key, Mark key_mark, YamlNode value);
  bool erase(std::string_view key);
  // How a message should name this value: `"abc"`, `-4`, `a list`, `a map`, `null`.
  std::string describe() const;

  static YamlNode make_scalar(std::string value, Mark mark, bool quoted = false);
  static YamlNode make_map(Mark mark);
};

struct YamlEntry {
  std::string key;
  Mark key_mark;
  YamlNode value;
};

struct ParseLimits {
  int max_depth = 64;          // nested maps and lists
  size_t max_nodes = 100'000;  // after alias expansion: defeats "billion laughs"
};

// Parses one YAML document. An empty document yields a Null node. Throws RecipeError on any
// syntax error or exceeded limit, with the position in `origin`. Problems that leave a usable tree
// (duplicate keys: the first value is kept) go to `soft_errors` when given, else are thrown too.
YamlNode parse_yaml(std::string_view text, std::shared_ptr<const Origin> origin, const ParseLimits& limits = {},
                    std::vector<Diagnostic>* soft_errors = nullptr);

}  // namespace engine::recipe
