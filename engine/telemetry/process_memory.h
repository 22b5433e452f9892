// This process's memory as the kernel counts it (/proc/self/status), in bytes: what a run reports
// beside its plan.
//
//   const int64_t before = resident_bytes();   // VmRSS now
//   ... train ...
//   out << format_bytes(peak_resident_bytes());  // VmHWM: the high-water mark
#pragma once

#include <cstdint>

namespace engine {

int64_t resident_bytes();       // current resident memory (VmRSS)
int64_t peak_resident_bytes();  // its high-water mark (VmHWM)
int64_t peak_virtual_bytes();   // the address space's high-water mark (VmPeak)

}  // namespace engine
