#include "png.h"

#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace engine::testing {

namespace {

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

uint8_t paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return uint8_t(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

}  // namespace

Image read_png(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file.size() < 8 || std::memcmp(file.data(), signature, 8) != 0)
    throw std::runtime_error(path.string() + ": not a PNG file");
  Image image;
  int channels = 0;
  std::vector<uint8_t> compressed;
  for (size_t at = 8; at + 12 <= file.size();) {
    const uint32_t length = be32(&file[at]);
    const std::string type(reinterpret_cast<const char*>(&file[at + 4]), 4);
    const uint8_t* data = &file[at + 8];
    if (at + 12 + length > file.size()) throw std::runtime_error(path.string() + ": truncated chunk " + type);
    if (type == "IHDR") {
      image.width = int(be32(data));
      image.height = int(be32(data + 4));
      const int depth = data[8], colour = data[9], interlace = data[12];
      if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0)
        throw std::runtime_error(path.string() + ": only 8-bit RGB(A) non-interlaced PNGs are read");
      channels = colour == 2 ? 3 : 4;
    } else if (type == "IDAT") {
      compressed.insert(compressed.end(), data, data + length);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + length;
  }
  if (channels == 0) throw std::runtime_error(path.string() + ": no IHDR");
  const size_t stride = size_t(image.width) * size_t(channels);
  std::vector<uint8_t> raw((stride + 1) * size_t(image.height));
  uLongf size = raw.size();
  if (uncompress(raw.data(), &size, compressed.data(), compressed.size()) != Z_OK || size != raw.size())
    throw std::runtime_error(path.string() + ": bad image data");

  std::vector<uint8_t> previous(stride, 0), row(stride);
  image.rgb.resize(size_t(image.width) * size_t(image.height) * 3);
  for (int y = 0; y < image.height; ++y) {
    const uint8_t filter = raw[size_t(y) * (stride + 1)];
    const uint8_t* line = &raw[size_t(y) * (stride + 1) + 1];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= size_t(channels) ? row[i - size_t(channels)] : 0, b = previous[i],
                c = i >= size_t(channels) ? previous[i - size_t(channels)] : 0;
      int value = line[i];
      switch (filter) {
        case 0:
          break;
        case 1:
          value += a;
          break;
        case 2:
          value += b;
          break;
        case 3:
          value += (a + b) / 2;
          break;
        case 4:
          value += paeth(a, b, c);
          break;
        default:
          throw std::runtime_error(path.string() + ": unknown filter " + std::to_string(filter));
      }
      row[i] = uint8_t(value);
    }
    for (int x = 0; x < image.width; ++x)
      std::memcpy(&image.rgb[(size_t(y) * size_t(image.width) + size_t(x)) * 3], &row[size_t(x) * size_t(channels)], 3);
    std::swap(previous, row);
  }
  return image;
}

}  // namespace engine::testing
