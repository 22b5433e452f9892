#include "telemetry/roofline.h"

#include <algorithm>

#include "core/format.h"
#include "telemetry/peak_flops.h"

namespace engine {

std::string MachineLimits::describe() const {
  auto known = [](double value, const char* unit) {
    return value > 0 ? format_fixed(value / 1e9, 1) + unit : std::string("unknown") + unit;
  };
  return known(flops_per_second, " GFLOP/s") + ", " + known(bytes_per_second, " GB/s") +
         (caveat.empty() ? "" : "; " + caveat);
}

std::string limits_caveat(double peak_neighbours_busy_percent, double bandwidth_neighbours_busy_percent) {
  std::string caveat;
  if (std::string note = busy_probe_note(peak_neighbours_busy_percent); !note.empty()) caveat = "the peak was " + note;
  if (std::string note = busy_probe_note(bandwidth_neighbours_busy_percent); !note.empty())
    caveat += (caveat.empty() ? "" : "; ") + std::string("the bandwidth was ") + note;
  return caveat;
}

MachineLimits machine_limits(DType compute, int threads) {
  const PeakFlops peak = peak_flops(compute, threads);
  const MemoryBandwidth bandwidth = memory_bandwidth(threads);
  return {peak.flops_per_second, bandwidth.bytes_per_second,
          limits_caveat(peak.neighbours_busy_percent, bandwidth.neighbours_busy_percent)};
}

RooflinePoint roofline(double flops, double bytes, double seconds, const MachineLimits& limits) {
  RooflinePoint point;
  const double compute = limits.flops_per_second > 0 ? std::max(flops, 0.0) / limits.flops_per_second : 0;
  const double memory = limits.bytes_per_second > 0 ? std::max(bytes, 0.0) / limits.bytes_per_second : 0;
  point.bound_seconds = std::max(compute, memory);
  point.memory_bound = memory > compute;
  if (seconds > 0) point.percent_of_bound = 100 * point.bound_seconds / seconds;
  return point;
}

}  // namespace engine
