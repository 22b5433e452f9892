// The roofline: an op's bound from its FLOPs and bytes against the machine's limits, and the
// memory-bandwidth probe and its cache.
#include "telemetry/roofline.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "telemetry/peak_flops.h"
#include "temp_dir.h"

namespace engine {
namespace {

TEST(Roofline, BoundIsTheSlowerOfComputeAndMemory) {
  const MachineLimits limits{1e11, 1e10};                  // balance: 10 FLOPs per byte
  RooflinePoint memory = roofline(1e9, 1e9, 0.2, limits);  // 0.01 s of compute, 0.1 s of traffic
  EXPECT_TRUE(memory.memory_bound);
  EXPECT_DOUBLE_EQ(memory.bound_seconds, 0.1);
  EXPECT_DOUBLE_EQ(memory.percent_of_bound, 50.0);
  RooflinePoint compute = roofline(1e11, 1e9, 4.0, limits);  // 1 s of compute, 0.1 s of traffic
  EXPECT_FALSE(compute.memory_bound);
  EXPECT_DOUBLE_EQ(compute.bound_seconds, 1.0);
  EXPECT_DOUBLE_EQ(compute.percent_of_bound, 25.0);
  EXPECT_DOUBLE_EQ(roofline(1e9, 1e9, 0, limits).percent_of_bound, 0.0);        // nothing measured
  EXPECT_DOUBLE_EQ(roofline(1e9, 1e9, 1, MachineLimits{}).bound_seconds, 0.0);  // no limits known
  EXPECT_EQ((MachineLimits{455.8e9, 35.9e9}.describe()), "455.8 GFLOP/s, 35.9 GB/s");
}

TEST(Roofline, BandwidthIsProbedOnceAndCached) {
  testing::TempDir cache("bandwidth_cache");
  ::setenv("XDG_CACHE_HOME", cache.path().c_str(), 1);
  EXPECT_GT(measure_triad_bandwidth(int64_t(1) << 20, 2), 1e8);  // any machine that runs the engine
  const MemoryBandwidth first = memory_bandwidth(1);
  EXPECT_EQ(first.source, "measured");
  const MemoryBandwidth second = memory_bandwidth(1);
  EXPECT_EQ(second.source, "cached in " + (cache / "engine/peak_flops.json").string());
  EXPECT_EQ(second.bytes_per_second, first.bytes_per_second);
  ::unsetenv("XDG_CACHE_HOME");
}

}  // namespace
}  // namespace engine
