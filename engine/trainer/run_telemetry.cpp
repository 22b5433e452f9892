#include "trainer/run_telemetry.h"

#include <omp.h>
#include <algorithm>
#include <cstdio>

#include "core/atomic_file.h"
#include "core/device_info.h"
#include "core/format.h"
#include "linalg/gemm16.h"
#include "linalg/matmul_probe.h"
#include "telemetry/roofline.h"
#include "telemetry/trace.h"
#include "trainer/progress_line.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

// Where a metrics key goes in TensorBoard: grouped so the dashboard's sections read naturally.
std::string scalar_tag(const std::string& key) {
  if (key == "val_loss") return "eval/val_loss";
  if (key.rfind("swap_", 0) == 0) return "offload/" + key;
  if (key == "rss_bytes" || key == "mem_available_bytes") return "memory/" + key;
  if (key == "cpu_util" || key == "process_cpu_util" || key == "temperature_c") return "hardware/" + key;
  if (key == "mfu" || key == "hfu" || key == "tokens_per_second" || key == "step_time_s" || key == "data_wait_s")
    return "throughput/" + key;
  return "train/" + key;
}

// The op table: per op, time, share, calls, achieved rates and the share of its roofline bound,
// slowest first.
void write_op_table(const std::map<std::string, OpTotals>& totals, const MachineLimits& limits, const fs::path& file,
                    std::ostream& out) {
  std::vector<std::pair<std::string, OpTotals>> rows(totals.begin(), totals.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double all = 0;
  for (const auto& row : rows) all += row.second.seconds;
  nlohmann::json json = nlohmann::json::array();
  char line[256];
  out << "\nop table (telemetry.op_table; roofline against " << limits.describe() << ")\n";
  std::snprintf(line, sizeof line, "%-28s %10s %7s %9s %10s %9s %8s %9s\n", "op", "seconds", "share", "calls",
                "GFLOP/s", "GB/s", "bound", "of bound");
  out << line;
  for (const auto& [name, t] : rows) {
    const double gflops = t.seconds > 0 ? t.flops / t.seconds / 1e9 : 0,
                 gbs = t.seconds > 0 ? t.bytes / t.seconds / 1e9 : 0;
    const bool measured_work = t.flops > 0 || t.bytes > 0;  // (communication) has neither
    const RooflinePoint point = roofline(t.flops, t.bytes, t.seconds, limits);
    std::snprintf(line, sizeof line, "%-28s %10.3f %6.1f%% %9lld %10.1f %9.2f %8s %8.1f%%\n", name.c_str(), t.seconds,
                  all > 0 ? 100 * t.seconds / all : 0.0, (long long)t.calls, gflops, gbs,
                  measured_work ? (point.memory_bound ? "memory" : "compute") : "-", point.percent_of_bound);
    out << line;
    nlohmann::json row{
        {"op", name}, {"seconds", t.seconds}, {"calls", t.calls}, {"flops", t.flops}, {"bytes", t.bytes}};
    if (measured_work) {
      row["bound"] = point.memory_bound ? "memory" : "compute";
      row["bound_seconds"] = point.bound_seconds;
      row["percent_of_bound"] = point.percent_of_bound;
    }
    json.push_back(std::move(row));
  }
  std::snprintf(line, sizeof line, "%-28s %10.3f\n", "total", all);
  out << line;
  write_file_atomically(file, [&](std::ostream& f) { f << json.dump(2) << "\n"; });
}

}  // namespace

RunTelemetry::RunTelemetry(TelemetrySetup setup, std::ostream& out)
    : setup_(std::move(setup)), config_(setup_.session.recipe.telemetry) {
  Session& session = setup_.session;
  session.executor.set_op_table(config_.op_table);
  if (!setup_.lead) return;
  if (config_.peak_flops > 0)
    peak_ = {config_.peak_flops, kRecipePeak, ""};
  else if (session.device.kind == Device::Kind::cuda)
    peak_ = {cuda::measure_matmul_flops(compute_dtype(session.recipe)), "measured",
             "cuBLASLt " + std::string(dtype_name(compute_dtype(session.recipe))) + " 8192^3"};
  else
    peak_ = peak_flops(compute_dtype(session.recipe), omp_get_max_threads());
  out << "MFU against " << format_fixed(peak_.flops_per_second / 1e9, 1) << " GFLOP/s per rank (" << peak_.source
      << (peak_.kernel.empty() ? "" : ", " + peak_.kernel) << "); model FLOPs per step "
      << format_fixed(setup_.model_flops_per_step / 1e9, 3) << " G";
  if (setup_.recompute_flops_per_step > 0)
    out << " (+ " << format_fixed(setup_.recompute_flops_per_step / 1e9, 3) << " G recomputed)";
  out << "\n";
  if (const std::string caveat = limits_caveat(peak_.neighbours_busy_percent, -1); !caveat.empty()) {
    const auto cache = peak_cache_file();
    out << "note: " << caveat << " (MFU reads high); "
        << (cache ? "delete " + cache->string() + " to probe again, or " : std::string())
        << "set telemetry.peak_flops\n";
  }
  if (const DType compute = compute_dtype(session.recipe);
      session.device.kind == Device::Kind::cpu && compute != DType::f32 && !ops::matmul_16bit_available(compute))
    out << "note: this CPU has no " << dtype_name(compute) << " matmul (oneDNN), so the linears compute in fp32 on "
        << "widened copies: " << dtype_name(compute)
        << " saves memory here, not time (engine plan shows each op's path)\n";
  if (config_.op_table)  // the roofline's: the device memory's on a GPU, the host's on a CPU
    bandwidth_ = session.device.kind == Device::Kind::cuda
                     ? MemoryBandwidth{cuda::measure_copy_bandwidth(), "measured (device-to-device copy)", -1}
                     : memory_bandwidth(omp_get_max_threads());
  if (config_.monitor_interval > 0) {
    std::unique_ptr<GpuSensors> gpu;
    if (session.device.kind == Device::Kind::cuda) {
      std::string why_not;
      gpu = GpuSensors::open(cuda_device_pci_bus_id(session.device.index), &why_not);
      if (!gpu) out << "note: no GPU utilisation, memory, temperature or power in the metrics: " << why_not << "\n";
    }
    monitor_ = std::make_unique<HardwareMonitor>(config_.monitor_interval, "", std::move(gpu));
  }
  if (config_.tensorboard) {
    tensorboard_ = std::make_unique<TensorBoardWriter>(setup_.run_dir / "tensorboard");
    tensorboard_->text("recipe", "```yaml\n" + setup_.recipe_yaml + "```", 0);
    tensorboard_->flush();
  }
}

RunTelemetry::~RunTelemetry() {
  if (trace::recording()) trace::stop();
}

void RunTelemetry::begin_step(int64_t step) {
  const int64_t first = config_.trace_start - 1;
  if (config_.trace_steps > 0 && step >= first && step < first + config_.trace_steps) {
    if (!trace::recording()) trace::start();
    if (trace_origin_ns_ < 0) trace_origin_ns_ = trace::now_ns();
  }
  step_start_ns_ = trace::now_ns();
}

void RunTelemetry::end_step(int64_t step) {
  if (!trace::recording()) return;
  trace::Event event{"step " + std::to_string(step + 1),
                     "step",
                     trace::Lane::compute,
                     step_start_ns_,
                     trace::now_ns(),
                     setup_.hardware_flops_per_step / double(setup_.session.world),  // this rank's share
                     -1,
                     ""};
  trace::record(std::move(event));
  if (step + 1 >= config_.trace_start - 1 + config_.trace_steps) trace::stop();
}

std::string RunTelemetry::add_to_log_line(nlohmann::json& line, double window_seconds, int64_t window_steps) {
  if (window_steps <= 0 || window_seconds <= 0) return "";
  const double step_time = window_seconds / double(window_steps);
  line["step_time_s"] = step_time;
  line["model_flops_per_step"] = setup_.model_flops_per_step;
  if (peak_.flops_per_second > 0) {
    const double peak = peak_.flops_per_second * double(setup_.session.world);
    line["mfu"] = setup_.model_flops_per_step / step_time / peak;
    line["hfu"] = setup_.hardware_flops_per_step / step_time / peak;
    if (line["hfu"].get<double>() > 1 && !warned_peak_) {
      warned_peak_ = true;
      const std::string utilisation =
          "warning: hardware FLOP utilisation " + format_fixed(100 * line["hfu"].get<double>(), 0) + "% exceeds ";
      if (peak_.source == kRecipePeak)
        return utilisation + "telemetry.peak_flops (" + format_fixed(peak_.flops_per_second / 1e9, 1) +
               " GFLOP/s per rank): the figure is too low";
      // The step beat the probe, so the probe read low: drop it, and the next run probes again.
      const bool dropped =
          forget_cached_peak(compute_dtype(setup_.session.recipe), omp_get_max_threads(), peak_.flops_per_second);
      return utilisation + "the peak (" + peak_.source +
             "), so its probe read low (most likely taken while the machine was busy); " +
             (dropped ? "dropped from the cache, the next run probes again (or set telemetry.peak_flops)"
                      : std::string("set telemetry.peak_flops"));
    }
  }
  const double wait = data_wait_window_ / double(window_steps);
  line["data_wait_s"] = wait;
  data_wait_window_ = 0;
  std::string warning;
  if (!warned_data_wait_ && wait > 0.1 * step_time && window_steps > 1) {
    warned_data_wait_ = true;
    warning = "warning: the step waited for data " + format_fixed(100 * wait / step_time, 0) +
              "% of its time; raise data.prefetch or move the data to a faster disk";
  }
  if (!monitor_) return warning;
  const HardwareSample hw = monitor_->latest();
  if (hw.cpu_util >= 0) line["cpu_util"] = hw.cpu_util;
  if (hw.process_cpu_util >= 0) line["process_cpu_util"] = hw.process_cpu_util;
  if (!hw.core_util.empty()) line["core_util"] = hw.core_util;
  if (hw.rss_bytes >= 0) line["rss_bytes"] = hw.rss_bytes;
  if (hw.mem_available_bytes >= 0) line["mem_available_bytes"] = hw.mem_available_bytes;
  if (hw.temperature_c >= 0) line["temperature_c"] = hw.temperature_c;
  if (hw.gpu.utilization_percent >= 0) line["gpu_util"] = hw.gpu.utilization_percent;
  if (hw.gpu.memory_used_bytes >= 0) line["gpu_memory_used_bytes"] = hw.gpu.memory_used_bytes;
  if (hw.gpu.temperature_c >= 0) line["gpu_temperature_c"] = hw.gpu.temperature_c;
  if (hw.gpu.power_w >= 0) line["gpu_power_w"] = hw.gpu.power_w;
  return warning;
}

void RunTelemetry::log(const nlohmann::json& line, int64_t step, double loss_scale, bool histograms_due) {
  std::vector<double> parameter_norms;
  const bool histograms = config_.tensorboard && config_.histograms && histograms_due;
  if (histograms) {  // every rank; a GPU run's masters where they live
    Session& session = setup_.session;
    parameter_norms = session.device_optimizer
                          ? session.zero.whole_unit_parameter_norms(session.device_optimizer->master_norm_partials())
                          : session.zero.unit_parameter_norms();
  }
  if (!tensorboard_) return;
  for (const auto& [key, value] : line.items()) {
    if (key == "step") continue;
    if (value.is_number()) tensorboard_->scalar(scalar_tag(key), value.get<double>(), step);
    if (key == "core_util" && value.is_array())
      for (size_t core = 0; core < value.size(); ++core)
        tensorboard_->scalar("hardware/core" + std::to_string(core) + "_util", value[core].get<double>(), step);
    if (value.is_boolean()) tensorboard_->scalar(scalar_tag(key), value.get<bool>() ? 1.0 : 0.0, step);
  }
  if (histograms) {
    std::vector<double> gradient_norms = setup_.session.zero.unit_gradient_norms();
    for (double& norm : gradient_norms) norm /= loss_scale;
    if (!gradient_norms.empty()) tensorboard_->histogram("norms/gradient_per_unit", gradient_norms, step);
    if (!parameter_norms.empty()) tensorboard_->histogram("norms/parameter_per_unit", parameter_norms, step);
  }
  tensorboard_->flush();
}

void RunTelemetry::finish(std::ostream& out) {
  trace::stop();
  Session& session = setup_.session;
  if (config_.trace_steps > 0) {
    // Every rank's events, as JSON, gathered to the lead: sizes first, then the padded texts.
    const std::string mine = trace::to_json(trace::take(), session.rank, trace_origin_ns_);
    std::vector<std::string> arrays{mine};
    if (session.world > 1) {
      const std::vector<double> sizes =
          session.zero.gather(std::vector<double>{double(mine.size())}, "the trace's sizes");
      const auto longest = int64_t(*std::max_element(sizes.begin(), sizes.end()));
      std::string padded = mine;
      padded.resize(size_t(longest), ' ');
      std::string all(size_t(longest) * size_t(session.world), ' ');
      session.comm.all_gather(padded.data(), all.data(), longest, "the trace").wait();
      arrays.clear();
      for (int r = 0; r < session.world; ++r)
        arrays.push_back(all.substr(size_t(r * longest), size_t(sizes[size_t(r)])));
    }
    if (setup_.lead) {
      const fs::path file = setup_.run_dir / "trace.json";
      write_file_atomically(file, [&](std::ostream& f) { f << trace::trace_file(arrays); });
      out << "trace of steps " << config_.trace_start << "-" << config_.trace_start + config_.trace_steps - 1 << ": "
          << file.string() << " (open it in https://ui.perfetto.dev)\n";
    }
  }
  if (config_.op_table && setup_.lead)
    write_op_table(session.executor.op_totals(),
                   {peak_.flops_per_second, bandwidth_.bytes_per_second,
                    limits_caveat(peak_.neighbours_busy_percent, bandwidth_.neighbours_busy_percent)},
                   setup_.run_dir / "op_table.json", out);
  if (tensorboard_) tensorboard_->flush();
}

}  // namespace engine
