#include "recipe/sections/sections.h"

namespace engine::recipe {

void declare_telemetry(Schema& schema) {
  auto section = schema.section(
      "telemetry", &Recipe::telemetry,
      "What a run records about itself besides metrics.jsonl: TensorBoard event files, a trace of chosen "
      "steps, the time per op, MFU and hardware samples (docs/telemetry.md). `engine report RUN_DIR` draws it.");
  section.key("tensorboard", &TelemetrySection::tensorboard)
      .def(true)
      .help(
          "Write TensorBoard event files to <run dir>/tensorboard: every logged metric as a scalar, the resolved "
          "recipe as text, and the histograms below (`tensorboard --logdir runs`).");
  section.key("histograms", &TelemetrySection::histograms)
      .def(true)
      .help("tensorboard: at each logged step, histograms of the parameter and gradient norms of the wrap units.");
  section.key("trace_start", &TelemetrySection::trace_start)
      .def(3)
      .min(1)
      .limit(int64_t(1) << 40)
      .unit("step")
      .help("The first traced step (1-based; the first steps include warm-up).");
  section.key("trace_steps", &TelemetrySection::trace_steps)
      .def(0)
      .min(0)
      .limit(1000)
      .unit("steps")
      .help(
          "Trace this many steps from trace_start into <run dir>/trace.json (Chrome trace-event format; open it "
          "in https://ui.perfetto.dev): every op, collective, offload transfer, data wait and checkpoint write "
          "with its FLOPs and bytes, one track per rank (0: no trace).");
  section.key("op_table", &TelemetrySection::op_table)
      .def(false)
      .help(
          "Time every op of every step; print the time per op (with its FLOP/s and bytes/s) at the end and keep "
          "it in <run dir>/op_table.json.");
  section.key("peak_flops", &TelemetrySection::peak_flops)
      .def(0.0)
      .min(0.0)
      .limit(1e20)
      .unit("FLOP/s")
      .help(
          "One rank's peak in the compute type, the denominator of MFU (0: measured once on this machine by a "
          "short GEMM probe and cached in ~/.cache/engine).");
  section.key("monitor_interval", &TelemetrySection::monitor_interval)
      .def(5.0)
      .min(0.0)
      .limit(86400.0)
      .unit("seconds")
      .help(
          "Sample the hardware (CPU utilisation per core, resident memory, available memory, temperature where "
          "readable) this often on a background thread; the latest sample goes into each logged metrics line "
          "(0: no monitoring).");
}

}  // namespace engine::recipe
