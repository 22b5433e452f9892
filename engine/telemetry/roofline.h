// Roofline: how close an op runs to what the machine allows. An op's bound is the longer of its
// FLOPs at the GEMM peak and its bytes at the memory bandwidth (both probed, telemetry/peak_flops.h);
// it is memory-bound when the bytes take longer. The share of its bound an op reaches is
// bound / measured time: 100% is the roof, 50% means it could run twice as fast.
//
//   MachineLimits limits = machine_limits(DType::f32, threads);
//   RooflinePoint p = roofline(node_flops, node_bytes, seconds, limits);   // p.percent_of_bound
//
// Bytes are what the op must move at least (its inputs and outputs once each; twice for what it
// reads and then writes in place, runtime/executor.h's node_work), so a memory-bound
// op's percentage is an upper bound on how well it uses the memory system.
#pragma once

#include <string>

#include "core/dtype.h"

namespace engine {

struct MachineLimits {
  double flops_per_second = 0;   // the GEMM peak in the compute type
  double bytes_per_second = 0;   // the triad bandwidth
  std::string caveat;            // which probe may read low (peak_flops.h's busy_probe_note), or empty
  std::string describe() const;  // "455.8 GFLOP/s, 35.9 GB/s" [+ "; <caveat>"]
};
// The caveat for the two probes ("" when neither was taken on a busy machine).
std::string limits_caveat(double peak_neighbours_busy_percent, double bandwidth_neighbours_busy_percent);
MachineLimits machine_limits(DType compute, int threads);

struct RooflinePoint {
  double bound_seconds = 0;
  bool memory_bound = false;
  double percent_of_bound = 0;  // 0 when nothing was measured
};
RooflinePoint roofline(double flops, double bytes, double seconds, const MachineLimits& limits);

}  // namespace engine
