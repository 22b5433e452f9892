#include "recipe/source.h"

#include <fstream>
#include <system_error>

#include "core/error.h"

namespace engine::recipe {

namespace fs = std::filesystem;

namespace {

// Length of the UTF-8 sequence starting at text[i], or 0 if it is malformed.
size_t utf8_length(const std::string& text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char lead = byte(i);
  size_t length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
  if (length == 0 || i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  if (length == 2 && lead < 0xC2) return 0;  // overlong
  return length;
}

}  // namespace

void check_text(const std::string& text, const std::string& name) {
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '\0') throw UserError(name + ": not a text file (NUL byte at offset " + std::to_string(i) + ")");
    size_t length = utf8_length(text, i);
    if (length == 0) throw UserError(name + ": not a text file (invalid UTF-8 at offset " + std::to_string(i) + ")");
    i += length;
  }
}

std::string FileSourceReader::read(const fs::path& path) const {
  std::error_code error;
  fs::file_status status = fs::status(path, error);
  if (error || !fs::exists(status)) throw UserError(path.string() + ": no such file");
  if (fs::is_directory(status)) throw UserError(path.string() + ": is a directory, expected a recipe file");
  if (!fs::is_regular_file(status)) throw UserError(path.string() + ": not a regular file");
  uintmax_t size = fs::file_size(path, error);
  if (error) throw UserError(path.string() + ": cannot read size: " + error.message());
  if (size > kMaxRecipeBytes)
    throw UserError(path.string() + ": file is " + std::to_string(size) + " bytes; recipes are limited to " +
                    std::to_string(kMaxRecipeBytes) + " bytes (data belongs in data files)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path.string() + ": cannot open for reading");
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) throw UserError(path.string() + ": read failed");
  check_text(text, path.string());
  return text;
}

std::string FileSourceReader::identity(const fs::path& path) const {
  std::error_code error;
  fs::path canonical = fs::weakly_canonical(path, error);
  return error ? path.lexically_normal().string() : canonical.string();
}

void MemorySourceReader::add(const fs::path& path, std::string text) {
  files_[path.lexically_normal().string()] = std::move(text);
}

std::string MemorySourceReader::read(const fs::path& path) const {
  auto it = files_.find(path.lexically_normal().string());
  if (it == files_.end()) throw UserError(path.string() + ": no such file");
  if (it->second.size() > kMaxRecipeBytes) throw UserError(path.string() + ": file is too large for a recipe");
  check_text(it->second, path.string());
  return it->second;
}

std::string MemorySourceReader::identity(const fs::path& path) const { return path.lexically_normal().string(); }

}  // namespace engine::recipe
