#include "trainer/telemetry.h"

#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>
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

ProgressLine::ProgressLine(std::ostream& out, bool terminal, int64_t total)
    : out_(out), terminal_(terminal), total_(total) {}

void ProgressLine::update(int64_t step, double loss, double lr, double rate, double elapsed, int64_t memory) {
  std::ostringstream line;
  char lr_text[32];
  std::snprintf(lr_text, sizeof lr_text, "%.2e", lr);
  double eta = step > 0 ? elapsed / double(step) * double(total_ - step) : 0;
  line << "step " << step << "/" << total_ << " | loss " << format_fixed(loss, 4) << " | lr " << lr_text << " | "
       << format_fixed(rate / 1000, 1) << "k tok/s | elapsed " << format_duration(elapsed) << " | ETA "
       << format_duration(eta) << " | mem " << format_bytes(memory);
  if (terminal_) {
    out_ << "\r\033[K" << line.str() << std::flush;
    live_ = true;
  } else {
    out_ << line.str() << "\n" << std::flush;
  }
}

void ProgressLine::note(const std::string& line) {
  if (terminal_ && live_) out_ << "\r\033[K";
  out_ << line << "\n" << std::flush;
  live_ = false;
}

void ProgressLine::finish() {
  if (terminal_ && live_) out_ << "\n";
  live_ = false;
}

}  // namespace engine
