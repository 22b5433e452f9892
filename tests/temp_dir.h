// TempDir: a fresh directory under the system's temporary directory, unique to this process and
// this object, removed with it. Test suites run concurrently (ctest -j, and several build trees at
// once), so a fixed name under /tmp would be shared by two runs that overwrite and delete each
// other's files; every test that needs scratch space takes one of these instead.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace engine::testing {

class TempDir {
 public:
  // `tag` only makes the name readable (engine_<tag>_XXXXXX); uniqueness comes from mkdtemp.
  explicit TempDir(const std::string& tag) {
    std::string pattern = (std::filesystem::temp_directory_path() / ("engine_" + tag + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp " + pattern + ": " + std::strerror(errno));
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;  // a destructor must not throw; a leftover directory is harmless
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace engine::testing
