// The golden comparison: exact and tolerance policies, the report, and file round trips.
#include "golden/golden.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "../temp_dir.h"
#include "core/error.h"

namespace engine {
namespace {

Trajectory trajectory(std::vector<double> losses) {
  Trajectory t;
  for (size_t i = 0; i < losses.size(); ++i) t.steps.push_back({int64_t(i + 1), losses[i], 1.0, 0.1});
  t.weights_digest = "00ff";
  return t;
}

TEST(Golden, ExactPolicyCatchesTheSmallestChangeAndReportsTheFirstStep) {
  GoldenFile golden{"0.1.0", "h", TolerancePolicy{}, trajectory({3.0, 2.5, 2.0, 1.5})};
  EXPECT_TRUE(compare(golden, trajectory({3.0, 2.5, 2.0, 1.5})).ok);
  Comparison c = compare(golden, trajectory({3.0, 2.5, std::nextafter(2.0, 3.0), 1.4}));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.report.find("first diverging step: 3 (loss)"), std::string::npos) << c.report;
  EXPECT_NE(c.report.find("loss: largest change 0.1"), std::string::npos) << c.report;
}

TEST(Golden, TolerancePolicyAcceptsWithinRtolAndAtol) {
  TolerancePolicy policy;
  policy.exact = false;
  policy.loss = policy.grad_norm = policy.lr = MetricTolerance{1e-3, 0};
  GoldenFile golden{"0.1.0", "h", policy, trajectory({3.0, 2.0})};
  EXPECT_TRUE(compare(golden, trajectory({3.002, 2.0})).ok);
  EXPECT_FALSE(compare(golden, trajectory({3.004, 2.0})).ok);
}

TEST(Golden, FinalWeightsMustMatchUnderTheExactPolicy) {
  GoldenFile golden{"0.1.0", "h", TolerancePolicy{}, trajectory({3.0})};
  Trajectory got = trajectory({3.0});
  got.weights_digest = "0100";
  Comparison c = compare(golden, got);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.report.find("final weights differ"), std::string::npos);
}

TEST(Golden, DifferentStepCountIsARegression) {
  GoldenFile golden{"0.1.0", "h", TolerancePolicy{}, trajectory({3.0, 2.0})};
  EXPECT_FALSE(compare(golden, trajectory({3.0})).ok);
}

TEST(Golden, FilesRoundTripAndMalformedOnesAreRefused) {
  const ::engine::testing::TempDir scratch("golden");
  const auto& dir = scratch.path();
  TolerancePolicy policy;
  policy.exact = false;
  policy.loss = {1e-5, 1e-7};
  GoldenFile golden{"0.1.0", "abc", policy, trajectory({3.0, 2.0})};
  write_golden(dir / "g.golden.json", golden);
  GoldenFile back = read_golden(dir / "g.golden.json");
  EXPECT_FALSE(back.policy.exact);
  EXPECT_DOUBLE_EQ(back.policy.loss.rtol, 1e-5);
  EXPECT_TRUE(compare(back, golden.trajectory).ok);
  std::ofstream(dir / "bad.golden.json") << "{\"steps\": 5}";
  EXPECT_THROW(read_golden(dir / "bad.golden.json"), UserError);
  EXPECT_THROW(read_golden(dir / "missing.golden.json"), UserError);
  EXPECT_EQ(golden_path("recipes/golden/gpt.yaml"), std::filesystem::path("recipes/golden/gpt.golden.json"));
}

}  // namespace
}  // namespace engine
