#include "telemetry/process_memory.h"

#include <fstream>
#include <string>

namespace engine {

namespace {

int64_t status_field(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return 0;
}

}  // namespace

int64_t resident_bytes() { return status_field("VmRSS"); }
int64_t peak_resident_bytes() { return status_field("VmHWM"); }
int64_t peak_virtual_bytes() { return status_field("VmPeak"); }

}  // namespace engine
