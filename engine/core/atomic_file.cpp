#include "core/atomic_file.h"

#include <fstream>

#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;

void write_file_atomically(const fs::path& path, const std::function<void(std::ostream&)>& write) {
  fs::path temporary = path;
  temporary += ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw UserError(temporary.string() + ": cannot open for writing");
    write(out);
    out.flush();
    if (!out) {
      out.close();
      std::error_code ignored;
      fs::remove(temporary, ignored);
      throw UserError(temporary.string() + ": write failed (disk full?)");
    }
  }
  std::error_code error;
  fs::rename(temporary, path, error);
  if (error) throw UserError(path.string() + ": cannot move the finished file into place: " + error.message());
}

}  // namespace engine
