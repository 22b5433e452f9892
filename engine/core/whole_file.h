// Reading a file whole: its bytes, or nothing when it cannot be opened or read. What a missing or
// unreadable file means is the caller's to say (a user error naming it, a default, "not known").
//
//   const std::optional<std::string> text = read_whole_file(run_dir / "summary.json");
//   if (!text) throw UserError("cannot read " + (run_dir / "summary.json").string());
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace engine {

std::optional<std::string> read_whole_file(const std::filesystem::path& path);

}  // namespace engine
