// What a user sees while training: a live progress line on a terminal, plain periodic lines
// otherwise (the number formatting is core/format.h's, the process's memory telemetry/process_memory.h's).
//
//   step 120/300 | loss 1.4821 | lr 2.1e-03 | 182.4k tok/s | elapsed 0:07 | ETA 0:10 | mem 142 MB
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>

#include "core/format.h"
#include "telemetry/process_memory.h"

namespace engine {

int64_t resident_bytes();       // current resident memory of this process
int64_t peak_resident_bytes();  // its high-water mark (VmHWM)
int64_t peak_virtual_bytes();   // its address space's high-water mark (VmPeak)

class ProgressLine {
 public:
  ProgressLine(std::ostream& out, bool terminal, int64_t total_steps);
  void update(int64_t step, double loss, double lr, double tokens_per_second, double elapsed, int64_t memory);
  // A line that stays (evaluation results), printed above the live line on a terminal.
  void note(const std::string& line);
  void finish();

 private:
  std::ostream& out_;
  bool terminal_;
  int64_t total_;
  bool live_ = false;
};

}  // namespace engine
