// A PNG reader for tests that look at screenshots: 8-bit RGB or RGBA, not interlaced (what Chromium
// writes), decoded with zlib into RGB triples.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

namespace engine::testing {

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3, row by row
};

// Throws std::runtime_error on anything it does not read.
Image read_png(const std::filesystem::path& path);

}  // namespace engine::testing
