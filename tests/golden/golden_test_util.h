// Shared by the golden tests: a private scratch directory, removed at the end of the test.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace engine::testing {

struct ScratchDirectory {
  std::filesystem::path path;
  ScratchDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "engine-golden-test-XXXXXX").string();
    if (mkdtemp(pattern.data())) path = pattern;
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace engine::testing
