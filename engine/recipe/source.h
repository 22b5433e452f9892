// SourceReader: where recipe files come from.
//
// The loader never touches the filesystem directly; it asks a SourceReader for the text of a path.
// FileSourceReader reads real files and refuses what is not a recipe before parsing it: a missing
// path, a directory, a file larger than the size limit, binary data or invalid UTF-8. Tests and
// the fuzz target use MemorySourceReader, an in-memory filesystem.
//
//   FileSourceReader files;
//   SourceText text = files.read("recipes/quickstart.yaml");   // throws UserError with a reason
#pragma once

#include <filesystem>
#include <map>
#include <string>

namespace engine::recipe {

inline constexpr size_t kMaxRecipeBytes = 1 << 20;  // 1 MiB: recipes are small, data lives elsewhere

class SourceReader {
 public:
  virtual ~SourceReader() = default;
  // Returns the text of `path`, or throws UserError naming the path and the reason.
  virtual std::string read(const std::filesystem::path& path) const = 0;
  // A stable identity for cycle detection (a canonical path for real files).
  virtual std::string identity(const std::filesystem::path& path) const = 0;
};

class FileSourceReader : public SourceReader {
 public:
  std::string read(const std::filesystem::path& path) const override;
  std::string identity(const std::filesystem::path& path) const override;
};

class MemorySourceReader : public SourceReader {
 public:
  void add(const std::filesystem::path& path, std::string text);
  std::string read(const std::filesystem::path& path) const override;
  std::string identity(const std::filesystem::path& path) const override;

 private:
  std::map<std::string, std::string> files_;
};

// Refuses text that is not a plausible recipe: NUL bytes or invalid UTF-8. Throws UserError.
void check_text(const std::string& text, const std::string& name);

}  // namespace engine::recipe
