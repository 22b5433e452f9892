#include "core/whole_file.h"

#include <fstream>

namespace engine {

std::optional<std::string> read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string bytes;
  std::error_code error;
  if (const auto size = std::filesystem::file_size(path, error); !error) bytes.reserve(size);
  // istream::read turns a failed read (EIO, a directory's EISDIR) into badbit; `in << rdbuf()` and
  // istreambuf_iterator would end the text there as if the file did.
  char chunk[1 << 16];
  for (;;) {
    in.read(chunk, sizeof chunk);
    bytes.append(chunk, size_t(in.gcount()));
    if (in.bad()) return std::nullopt;
    if (!in) return bytes;  // end of file
  }
}

}  // namespace engine
