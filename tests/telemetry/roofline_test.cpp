// The roofline: an op's bound from its FLOPs and bytes against the machine's limits, the bytes a
// node moves, and the memory-bandwidth probe and its cache.
#include "telemetry/roofline.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "graph/graph.h"
#include "linalg/linear.h"
#include "loss/cross_entropy.h"
#include "runtime/executor.h"
#include "scoped_env.h"
#include "telemetry/peak_flops.h"
#include "temp_dir.h"

namespace engine {
namespace {

TEST(Roofline, BoundIsTheSlowerOfComputeAndMemory) {
  const MachineLimits limits{1e11, 1e10, ""};              // balance: 10 FLOPs per byte
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
  EXPECT_EQ((MachineLimits{455.8e9, 35.9e9, ""}.describe()), "455.8 GFLOP/s, 35.9 GB/s");
  EXPECT_EQ(limits_caveat(5, -1), "");
  EXPECT_EQ(limits_caveat(5, 20), "the bandwidth was " + busy_probe_note(20));
  EXPECT_EQ(
      (MachineLimits{1e9, 1e9, limits_caveat(30, 20)}.describe()),
      "1.0 GFLOP/s, 1.0 GB/s; the peak was " + busy_probe_note(30) + "; the bandwidth was " + busy_probe_note(20));
}

// A node moves its inputs and outputs once each, except what it reads and writes back: the logits
// cross-entropy overwrites with their gradient, and a gradient a node accumulates into.
TEST(Roofline, BytesCountWhatANodeReadsAndWritesBackTwice) {
  Graph g;
  const int64_t rows = 6, vocab = 50, in = 7;
  const ValueId logits = g.add_activation("logits", Shape{rows, vocab});
  const ValueId targets = g.add_input("targets", Shape{rows}, DType::i32);
  ops::softmax_cross_entropy(g, logits, targets, 1.0, "loss");
  const NodeWork loss = node_work(g, g.nodes().back());
  EXPECT_DOUBLE_EQ(loss.bytes, 4.0 * (2 * rows * vocab + rows + rows));  // logits twice, targets, losses

  const ValueId dy = g.add_activation("dy", Shape{rows, vocab});
  const ValueId x = g.add_activation("x", Shape{rows, in});
  const ValueId dw = g.add_activation("dw", Shape{vocab, in});
  Node weight_gradient{&ops::kLinearBackwardWeight, {dy, x}, {dw}, {}, true, true, "head"};
  g.add_node(weight_gradient);
  EXPECT_DOUBLE_EQ(node_work(g, g.nodes().back()).bytes, 4.0 * (rows * vocab + rows * in + 2 * vocab * in));
  weight_gradient.accumulate = false;
  g.add_node(weight_gradient);
  EXPECT_DOUBLE_EQ(node_work(g, g.nodes().back()).bytes, 4.0 * (rows * vocab + rows * in + vocab * in));
}

TEST(Roofline, BandwidthIsProbedOnceAndCached) {
  testing::TempDir cache("bandwidth_cache");
  const testing::ScopedEnv cache_home("XDG_CACHE_HOME", cache.path().string());
  EXPECT_GT(measure_triad_bandwidth(int64_t(1) << 20, 2), 1e8);  // any machine that runs the engine
  const MemoryBandwidth first = memory_bandwidth(1);
  EXPECT_EQ(first.source, "measured");
  const MemoryBandwidth second = memory_bandwidth(1);
  EXPECT_EQ(second.source, "cached in " + (cache / "engine/peak_flops.json").string());
  EXPECT_EQ(second.bytes_per_second, first.bytes_per_second);
}

}  // namespace
}  // namespace engine
