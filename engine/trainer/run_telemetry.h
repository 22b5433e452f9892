// RunTelemetry: what `engine train` records about a run besides its metrics lines, driven by the
// recipe's telemetry section (docs/telemetry.md):
//   - MFU and hardware FLOP utilisation in each logged line, from the plan's FLOPs per step and
//     the rank's peak (telemetry/peak_flops.h);
//   - the latest hardware sample in each logged line (telemetry/hardware_monitor.h);
//   - TensorBoard event files with every logged number, the recipe and per-unit norm histograms;
//   - a trace of the chosen steps (telemetry/trace.h) gathered from every rank into trace.json;
//   - the time per op (telemetry.op_table), printed and kept in op_table.json.
//
//   RunTelemetry telemetry(setup);
//   telemetry.begin_step(step);  ...  telemetry.end_step(step);
//   telemetry.add_to_log_line(line, window_seconds, window_steps);  telemetry.log(line, step);
//   telemetry.finish(out);
//
// Every rank constructs one (the trace and the norms are collective); only the lead writes files.
#pragma once

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "telemetry/hardware_monitor.h"
#include "telemetry/peak_flops.h"
#include "telemetry/tensorboard_writer.h"
#include "trainer/session.h"

namespace engine {

struct TelemetrySetup {
  Session& session;
  bool lead = true;
  std::filesystem::path run_dir;
  std::string recipe_yaml;  // the resolved recipe, as TensorBoard text
  double model_flops_per_step = 0, hardware_flops_per_step = 0, recompute_flops_per_step = 0;  // all ranks
};

class RunTelemetry {
 public:
  RunTelemetry(TelemetrySetup setup, std::ostream& out);
  ~RunTelemetry();

  // Around each optimizer step (0-based `step`): the trace starts and stops here.
  void begin_step(int64_t step);
  void end_step(int64_t step);
  // Seconds the step waited for its batches (the loader's time inside next_batch).
  void add_data_wait(double seconds) { data_wait_window_ += seconds; }

  // Adds step_time_s, mfu, hfu, model_flops_per_step, data_wait_s and the hardware sample to a
  // logged line that covered `window_steps` steps in `window_seconds`. Returns a warning to show
  // (once per run) when the step waits for data, else "".
  std::string add_to_log_line(nlohmann::json& line, double window_seconds, int64_t window_steps);
  // Every number of a metrics line as a TensorBoard scalar (lead); at log steps, the unit norm
  // histograms (a collective: every rank calls it at the same steps).
  void log(const nlohmann::json& line, int64_t step, double loss_scale, bool histograms_due);
  // The trace (gathered from every rank), the op table and the event files' last records.
  void finish(std::ostream& out);

  const PeakFlops& peak() const { return peak_; }
  // The monitor's own cost: seconds its thread spent sampling, and its samples (0 without one).
  double monitor_seconds() const { return monitor_ ? monitor_->seconds_sampling() : 0; }
  int64_t monitor_samples() const { return monitor_ ? monitor_->latest().samples : 0; }

 private:
  TelemetrySetup setup_;
  const recipe::TelemetrySection& config_;
  PeakFlops peak_;
  MemoryBandwidth bandwidth_;  // for the op table's roofline
  std::unique_ptr<HardwareMonitor> monitor_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  double data_wait_window_ = 0;
  bool warned_data_wait_ = false, warned_peak_ = false;
  int64_t step_start_ns_ = 0;
  int64_t trace_origin_ns_ = -1;
};

}  // namespace engine
