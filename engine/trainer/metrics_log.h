// MetricsLog: a run's metrics.jsonl, one JSON object a line, written by rank 0 only (on the other
// ranks every call does nothing). The lines a run writes, each with its "step":
//   a step's      loss, lr, grad_norm, throughput and telemetry (step_line, built by the caller)
//   an overflow   loss, overflow: true, loss_scale, next_loss_scale (an fp16 update skipped)
//   a diverged    loss, grad_norm, lr (the last line of a run that stops on a non-finite value)
//   an evaluation val_loss
//   events        event: "resume" | "checkpoint", with what was read or written and how long it took
// Plugins append their own lines through stream().
//
//   MetricsLog metrics;
//   if (lead) metrics.open(run_dir / "metrics.jsonl", /*append=*/resumed);
//   metrics.validation(step + 1, val);
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace engine {

class MetricsLog {
 public:
  // Appends after a resume (the file truncated to the step resumed from), else starts it anew.
  void open(const std::filesystem::path& file, bool append);
  bool is_open() const { return out_.is_open(); }
  std::ostream* stream() { return &out_; }  // for plugins' lines (an unopened stream drops them)

  void step_line(const nlohmann::json& line);  // flushed: a live run's progress is readable
  void overflow(int64_t step, double loss, double loss_scale, double next_loss_scale);
  void diverged(int64_t step, double loss, double grad_norm, double lr);
  void validation(int64_t step, double val_loss);
  void resumed(int64_t step, const std::string& path, int64_t bytes, double read_seconds, int world_size);
  void checkpoint(int64_t step, const std::string& path, int64_t bytes, double write_seconds, double commit_seconds);

 private:
  void write(const nlohmann::json& line, bool flush);
  std::ofstream out_;
};

}  // namespace engine
