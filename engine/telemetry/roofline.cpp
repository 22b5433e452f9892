#include "telemetry/roofline.h"

#include <algorithm>

#include "core/format.h"
#include "telemetry/peak_flops.h"
#include "trainer/telemetry.h"

namespace engine {

std::string MachineLimits::describe() const {
  auto known = [](double value, const char* unit) {
    return value > 0 ? format_fixed(value / 1e9, 1) + unit : std::string("unknown") + unit;
  };
  return known(flops_per_second, " GFLOP/s") + ", " + known(bytes_per_second, " GB/s");
}

MachineLimits machine_limits(DType compute, int threads) {
  return {peak_flops(compute, threads).flops_per_second, memory_bandwidth(threads).bytes_per_second};
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
