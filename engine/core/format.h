// Numbers as people read them: sizes (format_bytes(149200000) is "142.3 MB": powers of 1024, one
// decimal), fixed decimals (format_fixed(1.48213, 4) is "1.4821") and durations
// (format_duration(3723) is "1:02:03", format_duration(7) "0:07").
#pragma once

#include <cstdint>
#include <string>

namespace engine {

std::string format_bytes(int64_t bytes);
std::string format_fixed(double value, int digits);
std::string format_duration(double seconds);

}  // namespace engine
