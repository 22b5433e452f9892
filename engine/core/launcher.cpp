#include "core/launcher.h"

#include <cerrno>
#include <cstdlib>
#include <optional>
#include <string>

namespace engine {

namespace {

std::optional<long long> whole_number(const char* text) {
  if (!text || !*text) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

}  // namespace

Launch launch_from_environment(const GetEnv& getenv) {
  for (auto [rank_name, size_name] :
       {std::pair{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, std::pair{"PMI_RANK", "PMI_SIZE"}}) {
    std::optional<long long> size = whole_number(getenv(size_name));
    if (!size || *size < 1 || *size > (1 << 20)) continue;
    std::optional<long long> rank = whole_number(getenv(rank_name));
    return Launch{rank && *rank >= 0 && *rank < *size ? int(*rank) : 0, int(*size)};
  }
  return Launch{};
}

Launch launch_from_environment() {
  return launch_from_environment([](const char* name) { return std::getenv(name); });
}

}  // namespace engine
