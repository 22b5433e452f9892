// Errors: the engine's two channels.
//
// A *user error* is a mistake someone can fix (a recipe typo, a missing file, a bad override). It
// carries a readable message and makes the CLI exit with status 2, never with a stack trace.
// An *internal error* is a broken invariant of the engine itself; ENGINE_CHECK raises it with the
// source location and the CLI exits with status 1, asking for a bug report.
//
//   if (!std::filesystem::exists(path)) throw UserError("data file not found: " + path.string());
//   ENGINE_CHECK(offset + size <= arena_size, "buffer overruns the arena");
#pragma once

#include <stdexcept>
#include <string>

namespace engine {

class UserError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void fail_check(const char* condition, const char* file, int line, const std::string& message);

}  // namespace engine

#define ENGINE_CHECK(condition, message)                                               \
  do {                                                                                 \
    if (!(condition)) ::engine::fail_check(#condition, __FILE__, __LINE__, (message)); \
  } while (false)
