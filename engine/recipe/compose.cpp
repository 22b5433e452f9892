#include "recipe/compose.h"

namespace engine::recipe {

namespace fs = std::filesystem;

void deep_merge(YamlNode& bottom, YamlNode top) {
  // An empty section (`optimizer:` with its keys commented out) adds nothing; it does not erase
  // what a base set. Use a `~section` override to remove a section.
  if (bottom.is_map() && top.kind == YamlNode::Kind::Null) return;
  if (!bottom.is_map() || !top.is_map()) {
    bottom = std::move(top);
    return;
  }
  for (auto& entry : top.entries) {
    YamlNode* existing = bottom.find(entry.key);
    if (existing && existing->is_map() && entry.value.kind == YamlNode::Kind::Null) continue;
    if (existing && existing->is_map() && entry.value.is_map()) {
      deep_merge(*existing, std::move(entry.value));
    } else {
      bottom.set(entry.key, entry.key_mark, std::move(entry.value));
    }
  }
}

namespace {

struct Composer {
  const SourceReader& reader;
  std::vector<Diagnostic>& soft_errors;
  std::vector<std::pair<std::string, std::string>> chain;  // (identity, display name) being loaded
  int files_loaded = 0;

  YamlNode load(const fs::path& path, std::string included_from) {
    std::string identity = reader.identity(path);
    for (size_t i = 0; i < chain.size(); ++i) {
      if (chain[i].first != identity) continue;
      std::string cycle;
      for (size_t k = i; k < chain.size(); ++k) cycle += chain[k].second + " -> ";
      cycle += path.string();
      throw RecipeError({Diagnostic{Mark{std::make_shared<Origin>(Origin{included_from, "", nullptr}), 0, 0},
                                    "base",
                                    "bases form a cycle: " + cycle,
                                    {}}});
    }
    if (static_cast<int>(chain.size()) >= kMaxBaseDepth)
      throw UserError(path.string() + ": bases nest deeper than " + std::to_string(kMaxBaseDepth) + " files");
    // Every inclusion counts, so bases that fan out (a diamond repeated at every level) stop here
    // instead of loading an exponential number of files.
    if (++files_loaded > kMaxBaseFiles)
      throw UserError(path.string() + ": a recipe may load at most " + std::to_string(kMaxBaseFiles) +
                      " files through its bases (counting repeats)");

    auto text = std::make_shared<const std::string>(reader.read(path));
    auto origin = std::make_shared<Origin>(Origin{path.string(), std::move(included_from), text});
    YamlNode root = parse_yaml(*text, origin, ParseLimits{}, &soft_errors);
    if (root.kind == YamlNode::Kind::Null) {
      if (chain.empty())
        throw RecipeError({Diagnostic{
            Mark{origin, 1, 1}, "", "recipe is empty; it needs at least the model, data and train sections", {}}});
      return YamlNode::make_map(root.mark);
    }
    if (!root.is_map())
      throw RecipeError({Diagnostic{root.mark, "", "a recipe is a map of sections, found " + root.describe(), {}}});

    const YamlEntry* base_entry = root.find_entry("base");
    if (!base_entry) return root;

    std::vector<const YamlNode*> base_paths;
    const YamlNode& base = base_entry->value;
    if (base.kind == YamlNode::Kind::Scalar) {
      base_paths.push_back(&base);
    } else if (base.kind == YamlNode::Kind::Sequence) {
      for (const auto& item : base.items) base_paths.push_back(&item);
    } else {
      throw RecipeError(
          {Diagnostic{base.mark, "base", "expected a path or a list of paths, found " + base.describe(), {}}});
    }

    chain.emplace_back(identity, path.string());
    YamlNode merged = YamlNode::make_map(root.mark);
    DiagnosticSink sink;
    for (const YamlNode* item : base_paths) {
      if (item->kind != YamlNode::Kind::Scalar || item->scalar.empty()) {
        sink.error(item->mark, "base", "expected a path, found " + item->describe());
        continue;
      }
      fs::path base_path = (path.parent_path() / item->scalar).lexically_normal();
      try {
        deep_merge(merged, load(base_path, item->mark.str()));
      } catch (const RecipeError&) {
        throw;
      } catch (const UserError& e) {
        sink.error(item->mark, "base", e.what());
      }
    }
    chain.pop_back();
    sink.throw_if_any();

    root.erase("base");
    deep_merge(merged, std::move(root));
    return merged;
  }
};

std::vector<std::string> split_key(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

YamlNode compose_recipe(const fs::path& path, const SourceReader& reader, std::vector<Diagnostic>& soft_errors) {
  Composer composer{reader, soft_errors, {}};
  return composer.load(path, "");
}

std::vector<DeletedKey> apply_overrides(YamlNode& root, const std::vector<std::string>& overrides,
                                        DiagnosticSink& sink) {
  std::vector<DeletedKey> deleted;
  auto command_line = std::make_shared<Origin>(Origin{"<command line>", "", nullptr});
  for (size_t index = 0; index < overrides.size(); ++index) {
    const std::string& text = overrides[index];
    int number = static_cast<int>(index) + 1;
    Mark at{command_line, number, 1};
    bool remove = !text.empty() && text[0] == '~';
    size_t equals = text.find('=');
    std::string key = remove ? text.substr(1) : text.substr(0, equals);
    if ((!remove && equals == std::string::npos) || (remove && equals != std::string::npos)) {
      sink.error(at, "", "override '" + text + "' must look like section.key=value or ~section.key");
      continue;
    }
    std::vector<std::string> parts = split_key(key);
    bool empty_part = false;
    for (const auto& part : parts) empty_part |= part.empty();
    if (empty_part) {
      sink.error(at, key, "override '" + text + "' has an empty key name");
      continue;
    }
    if (parts[0] == "base") {
      sink.error(at, "base", "bases cannot be changed on the command line; write a recipe that names them");
      continue;
    }

    YamlNode value;
    if (!remove) {
      std::string value_text = text.substr(equals + 1);
      int value_column = static_cast<int>(equals) + 2;
      try {
        auto origin = std::make_shared<Origin>(Origin{"<command line>", "", nullptr});
        value = parse_yaml(value_text, origin, ParseLimits{16, 10'000});
      } catch (const RecipeError& e) {
        for (const auto& d : e.diagnostics())
          sink.error(Mark{command_line, number, value_column + std::max(0, d.mark.column - 1)}, key, d.message);
        continue;
      }
      // Every value of an override is marked with the override's position.
      std::vector<YamlNode*> pending{&value};
      while (!pending.empty()) {
        YamlNode* node = pending.back();
        pending.pop_back();
        node->mark = Mark{command_line, number, value_column};
        for (auto& item : node->items) pending.push_back(&item);
        for (auto& entry : node->entries) {
          entry.key_mark = node->mark;
          pending.push_back(&entry.value);
        }
      }
    }

    if (remove) deleted.push_back({at, key});
    YamlNode* parent = &root;
    bool failed = false;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      YamlNode* child = parent->find(parts[i]);
      if (child && child->kind == YamlNode::Kind::Null && !remove) {
        *child = YamlNode::make_map(at);  // an empty section: fill it
      }
      if (!child) {
        if (remove) {
          failed = true;  // nothing to delete
          break;
        }
        parent->set(parts[i], at, YamlNode::make_map(at));
        child = parent->find(parts[i]);
      } else if (!child->is_map()) {
        std::string prefix;
        for (size_t k = 0; k <= i; ++k) prefix += (k ? "." : "") + parts[k];
        if (!remove)
          sink.error(at, key, "cannot reach into '" + prefix + "': it is " + child->describe() + ", not a map");
        failed = true;
        break;
      }
      parent = child;
    }
    if (failed) continue;
    if (remove) {
      parent->erase(parts.back());
    } else {
      parent->set(parts.back(), at, std::move(value));
    }
  }
  return deleted;
}

}  // namespace engine::recipe
