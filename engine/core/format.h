// Sizes as people read them: format_bytes(149200000) is "142.3 MB" (powers of 1024, one decimal).
#pragma once

#include <cstdint>
#include <string>

namespace engine {

std::string format_bytes(int64_t bytes);

}  // namespace engine
