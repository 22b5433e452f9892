// Writing a file so that it is either complete or absent: the bytes go to `<path>.tmp`, which is
// renamed over `path` only once everything was written and flushed. A full disk or a crash never
// leaves a half-written weights file, golden file or recipe behind.
//
//   write_file_atomically(run_dir / "summary.json", [&](std::ostream& out) { out << json.dump(2); });
#pragma once

#include <filesystem>
#include <functional>
#include <iosfwd>

namespace engine {

// Throws UserError naming the file when it cannot be opened, written or moved into place.
void write_file_atomically(const std::filesystem::path& path, const std::function<void(std::ostream&)>& write);

}  // namespace engine
