#include "recipe/yaml_tree.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/parser.h>

#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace engine::recipe {

const YamlEntry* YamlNode::find_entry(std::string_view key) const {
  for (const auto& entry : entries)
    if (entry.key == key) return &entry;
  return nullptr;
}

const YamlNode* YamlNode::find(std::string_view key) const {
  const YamlEntry* entry = find_entry(key);
  return entry ? &entry->value : nullptr;
}

YamlNode* YamlNode::find(std::string_view key) {
  return const_cast<YamlNode*>(static_cast<const YamlNode*>(this)->find(key));
}

void YamlNode::set(std::string key, Mark key_mark, YamlNode value) {
  for (auto& entry : entries) {
    if (entry.key == key) {
      entry.key_mark = std::move(key_mark);
      entry.value = std::move(value);
      return;
    }
  }
  entries.push_back({std::move(key), std::move(key_mark), std::move(value)});
}

bool YamlNode::erase(std::string_view key) {
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->key == key) {
      entries.erase(it);
      return true;
    }
  }
  return false;
}

std::string YamlNode::describe() const {
  switch (kind) {
    case Kind::Null:
      return "null";
    case Kind::Sequence:
      return "a list";
    case Kind::Map:
      return "a map";
    case Kind::Scalar:
      break;
  }
  // At most 40 characters (cut at a UTF-8 boundary), with line breaks shown as \n.
  std::string shown;
  size_t characters = 0;
  for (size_t i = 0; i < scalar.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(scalar[i]);
    if ((c & 0xC0) != 0x80 && ++characters > 40) {
      shown += "...";
      break;
    }
    if (c == '\n')
      shown += "\\n";
    else if (c == '\r')
      shown += "\\r";
    else
      shown += static_cast<char>(c);
  }
  return quoted ? "\"" + shown + "\" (a quoted string)" : "'" + shown + "'";
}

YamlNode YamlNode::make_scalar(std::string value, Mark mark, bool quoted) {
  YamlNode node;
  node.kind = Kind::Scalar;
  node.scalar = std::move(value);
  node.mark = std::move(mark);
  node.quoted = quoted;
  return node;
}

YamlNode YamlNode::make_map(Mark mark) {
  YamlNode node;
  node.kind = Kind::Map;
  node.mark = std::move(mark);
  return node;
}

namespace {

// A limit was exceeded or the document is malformed; unwinds out of yaml-cpp's parser.
struct Abort {
  Mark mark;
  std::string message;
};

// Builds a YamlNode tree from yaml-cpp events with an explicit stack (no recursion).
class TreeBuilder : public YAML::EventHandler {
 public:
  TreeBuilder(std::shared_ptr<const Origin> origin, const ParseLimits& limits)
      : origin_(std::move(origin)), limits_(limits) {}

  YamlNode take_root() { return std::move(root_); }
  std::vector<Diagnostic>& errors() { return errors_; }
  int documents() const { return documents_; }
  Mark mark(const YAML::Mark& m) const { return Mark{origin_, m.line + 1, m.column + 1, m.pos}; }

  void OnDocumentStart(const YAML::Mark& m) override {
    if (++documents_ > 1) throw Abort{mark(m), "a recipe holds one YAML document; found a second '---'"};
  }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& m, YAML::anchor_t anchor) override {
    count(m);
    YamlNode node;
    node.mark = mark(m);
    finish(std::move(node), anchor);
  }

  void OnAlias(const YAML::Mark& m, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end())
      throw Abort{mark(m), "alias refers to an anchor that is still being defined (a cyclic alias)"};
    YamlNode copy = copy_counted(it->second, mark(m));
    finish(std::move(copy), 0);
  }

  void OnScalar(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor, const std::string& value) override {
    bool quoted = tag == "!";
    if (tag == "tag:yaml.org,2002:str")
      quoted = true;
    else if (tag != "?" && tag != "!")
      throw Abort{mark(m), "YAML tags such as '" + tag + "' are not supported in recipes"};
    count(m);
    finish(YamlNode::make_scalar(value, mark(m), quoted), anchor);
  }

  void OnSequenceStart(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(m, tag, anchor, YamlNode::Kind::Sequence);
  }
  void OnSequenceEnd() override { close(); }

  void OnMapStart(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(m, tag, anchor, YamlNode::Kind::Map);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    YamlNode node;
    YAML::anchor_t anchor = 0;
    bool has_key = false;
    bool skip_value = false;  // the pending key is a duplicate
    std::string key;
    Mark key_mark;
    std::unordered_map<std::string, Mark> seen;  // key -> where first written
  };

  void count(const YAML::Mark& m) {
    if (++nodes_ > limits_.max_nodes)
      throw Abort{mark(m), "document has more than " + std::to_string(limits_.max_nodes) +
                               " values (after expanding aliases); recipes are small files"};
  }

  void open(const YAML::Mark& m, const std::string& tag, YAML::anchor_t anchor, YamlNode::Kind kind) {
    if (tag != "?" && tag != "!" && !tag.empty())
      throw Abort{mark(m), "YAML tags such as '" + tag + "' are not supported in recipes"};
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      throw Abort{mark(m), "nesting deeper than " + std::to_string(limits_.max_depth) + " levels"};
    count(m);
    Frame frame;
    frame.node.kind = kind;
    frame.node.mark = mark(m);
    frame.anchor = anchor;
    stack_.push_back(std::move(frame));
  }

  void close() {
    Frame frame = std::move(stack_.back());
    stack_.pop_back();
    if (frame.has_key) throw Abort{frame.key_mark, "key '" + frame.key + "' has no value"};
    finish(std::move(frame.node), frame.anchor);
  }

  void finish(YamlNode node, YAML::anchor_t anchor) {
    if (anchor != 0) {
      anchors_[anchor] = copy_counted(node, node.mark);  // the stored copy counts against the budget
    }
    if (stack_.empty()) {
      root_ = std::move(node);
      return;
    }
    Frame& top = stack_.back();
    if (top.node.kind == YamlNode::Kind::Sequence) {
      top.node.items.push_back(std::move(node));
      return;
    }
    if (!top.has_key) {
      if (node.kind != YamlNode::Kind::Scalar)
        throw Abort{node.mark, "keys must be plain names, found " + node.describe() + " used as a key"};
      if (node.scalar == "<<")
        throw Abort{node.mark, "YAML merge keys ('<<') are not supported; compose recipes with 'base:'"};
      auto [it, inserted] = top.seen.emplace(node.scalar, node.mark);
      if (!inserted) {  // reported, and the second value dropped, so parsing can go on to find more
        errors_.push_back(
            {node.mark, "", "duplicate key '" + node.scalar + "' (first written at " + it->second.str() + ")", {}});
        top.skip_value = true;
      }
      top.has_key = true;
      top.key = std::move(node.scalar);
      top.key_mark = node.mark;
      return;
    }
    if (!top.skip_value) top.node.entries.push_back({std::move(top.key), std::move(top.key_mark), std::move(node)});
    top.skip_value = false;
    top.has_key = false;
    top.key.clear();
  }

  // Deep copy whose every node counts against the node budget. Depth is bounded by max_depth.
  YamlNode copy_counted(const YamlNode& source, const Mark& at) {
    if (++nodes_ > limits_.max_nodes)
      throw Abort{at, "document has more than " + std::to_string(limits_.max_nodes) +
                          " values after expanding aliases (an alias bomb?)"};
    YamlNode copy;
    copy.kind = source.kind;
    copy.mark = source.mark;
    copy.scalar = source.scalar;
    copy.quoted = source.quoted;
    copy.items.reserve(source.items.size());
    for (const auto& item : source.items) copy.items.push_back(copy_counted(item, at));
    copy.entries.reserve(source.entries.size());
    for (const auto& entry : source.entries)
      copy.entries.push_back({entry.key, entry.key_mark, copy_counted(entry.value, at)});
    return copy;
  }

  std::shared_ptr<const Origin> origin_;
  ParseLimits limits_;
  std::vector<Frame> stack_;
  std::unordered_map<YAML::anchor_t, YamlNode> anchors_;
  YamlNode root_;
  size_t nodes_ = 0;
  int documents_ = 0;
  std::vector<Diagnostic> errors_;  // problems that do not stop parsing
};

}  // namespace

YamlNode parse_yaml(std::string_view text, std::shared_ptr<const Origin> origin, const ParseLimits& limits,
                    std::vector<Diagnostic>* soft_errors) {
  std::istringstream stream{std::string(text)};
  TreeBuilder builder(origin, limits);
  try {
    YAML::Parser parser(stream);
    while (parser.HandleNextDocument(builder)) {
    }
  } catch (const Abort& abort) {
    throw RecipeError({Diagnostic{abort.mark, "", abort.message, {}}});
  } catch (const YAML::DeepRecursion& e) {
    throw RecipeError({Diagnostic{builder.mark(e.mark), "", "nesting is too deep", {}}});
  } catch (const YAML::Exception& e) {
    throw RecipeError({Diagnostic{builder.mark(e.mark), "", "invalid YAML: " + e.msg, {}}});
  }
  if (!builder.errors().empty()) {
    if (!soft_errors) throw RecipeError(std::move(builder.errors()));
    for (auto& d : builder.errors()) soft_errors->push_back(std::move(d));
  }
  YamlNode root = builder.take_root();
  if (builder.documents() == 0) root.mark = Mark{origin, 1, 1};
  return root;
}

}  // namespace engine::recipe
