#include "trainer/progress_line.h"

#include <cstdio>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

namespace engine {

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
