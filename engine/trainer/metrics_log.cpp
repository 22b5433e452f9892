#include "trainer/metrics_log.h"

namespace engine {

void MetricsLog::open(const std::filesystem::path& file, bool append) {
  out_.open(file, append ? std::ios::app : std::ios::trunc);
}

void MetricsLog::write(const nlohmann::json& line, bool flush) {
  if (!out_.is_open()) return;
  out_ << line.dump() << "\n";
  if (flush) out_.flush();
}

void MetricsLog::step_line(const nlohmann::json& line) { write(line, true); }

void MetricsLog::overflow(int64_t step, double loss, double loss_scale, double next_loss_scale) {
  write({{"step", step},
         {"loss", loss},
         {"overflow", true},
         {"loss_scale", loss_scale},
         {"next_loss_scale", next_loss_scale}},
        false);
}

void MetricsLog::diverged(int64_t step, double loss, double grad_norm, double lr) {
  write({{"step", step}, {"loss", loss}, {"grad_norm", grad_norm}, {"lr", lr}}, false);
}

void MetricsLog::validation(int64_t step, double val_loss) { write({{"step", step}, {"val_loss", val_loss}}, true); }

void MetricsLog::resumed(int64_t step, const std::string& path, int64_t bytes, double read_seconds, int world_size) {
  write({{"step", step},
         {"event", "resume"},
         {"path", path},
         {"bytes", bytes},
         {"read_s", read_seconds},
         {"world_size", world_size}},
        false);
}

void MetricsLog::checkpoint(int64_t step, const std::string& path, int64_t bytes, double write_seconds,
                            double commit_seconds) {
  write({{"step", step},
         {"event", "checkpoint"},
         {"path", path},
         {"bytes", bytes},
         {"write_s", write_seconds},
         {"commit_s", commit_seconds}},
        false);
}

}  // namespace engine
