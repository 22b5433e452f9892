#include "core/error.h"

namespace engine {

void fail_check(const char* condition, const char* file, int line, const std::string& message) {
  throw InternalError(std::string(file) + ":" + std::to_string(line) + ": check failed: " + condition +
                      (message.empty() ? "" : ": " + message));
}

}  // namespace engine
