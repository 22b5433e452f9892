#include "core/atomic_file.h"

#include <fstream>

#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  // A directory in the way would fail only at the rename, after the whole file was written beside it.
  std::error_code status_error;
  if (fs::is_directory(path, status_error) || (!path.has_filename() && !path.empty()))
    throw UserError(path.string() + " is a directory: name the file to write (e.g. " +
                    (path / "model.safetensors").lexically_normal().string() + ")");
  fs::path temporary = path;
  temporary += ".tmp";
  const auto discard = [&] {
    std::error_code ignored;
    fs::remove(temporary, ignored);
  };
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(temporary.string() + ": cannot open for writing");
    try {
      write(out);
    } catch (...) {
      out.close();
      discard();
      throw;
    }
    out.flush();
    if (!out) {
      out.close();
      discard();
      throw UserError(temporary.string() + ": write failed (disk full?)");
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) {
    discard();
    throw UserError(path.string() + ": cannot move the finished file into place: " + error.message());
  }
}

}  // namespace engine
