// run_shell: a shell command's exit status and its output (stdout and stderr together), for tests
// that run the engine binary as a user would.
//
//   const ShellResult r = run_shell("'" ENGINE_BINARY "' validate recipes/quickstart.yaml", source_dir);
//   EXPECT_EQ(r.status, 0) << r.output;
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <string>

namespace engine::testing {

struct ShellResult {
  int status;          // the exit status, or 128 + the signal that ended it; -1 if it could not start
  std::string output;  // stdout and stderr together
};

// Runs `command` with /bin/sh (popen) in `directory` (the current one when empty). The command
// goes into a subshell with a space and a newline around it, so a command that itself opens with
// "(" never reads as bash's "((" arithmetic, and one ending in a comment still closes.
inline ShellResult run_shell(const std::string& command, const std::filesystem::path& directory = {}) {
  const std::string full =
      (directory.empty() ? std::string() : "cd '" + directory.string() + "' && ") + "( " + command + "\n) 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  ShellResult result{-1, ""};
  if (!pipe) return result;
  std::array<char, 4096> buffer{};
  while (size_t n = fread(buffer.data(), 1, buffer.size(), pipe)) result.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

}  // namespace engine::testing
