// fp16 loss scaling: the scaler's schedule, and overflowing steps injected into a real run are
// skipped as if their batches had never been seen.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "optim/loss_scaler.h"
#include "run_util.h"

namespace engine {
namespace {

using Outcome = LossScaler::Outcome;

recipe::PrecisionSection dynamic_fp16(int64_t power, int64_t interval, int64_t hysteresis, double min_scale) {
  auto p = testing::quickstart({}).recipe.precision;
  p.mode = recipe::PrecisionMode::fp16;
  p.loss_scaling = recipe::LossScaling::dynamic;
  p.initial_scale_power = power;
  p.growth_interval = interval;
  p.scale_factor = 2;
  p.hysteresis = hysteresis;
  p.min_scale = min_scale;
  return p;
}

TEST(LossScaler, GrowsAfterCleanStepsAndBacksOffWithHysteresis) {
  LossScaler s(dynamic_fp16(4, 3, 2, 4));
  EXPECT_EQ(s.scale(), 16);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(s.update(false), Outcome::applied);
  EXPECT_EQ(s.scale(), 32);                     // grew after 3 clean steps
  EXPECT_EQ(s.update(true), Outcome::skipped);  // first overflow spends the hysteresis
  EXPECT_EQ(s.scale(), 32);
  EXPECT_EQ(s.update(true), Outcome::skipped);  // second backs off
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.update(true), Outcome::skipped);  // hysteresis is not refilled by a backoff
  EXPECT_EQ(s.scale(), 8);
  for (int i = 0; i < 2; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 8);  // the clean count restarted at the overflow
  s.update(false);
  EXPECT_EQ(s.scale(), 16);  // ... and growth refills the hysteresis
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 16);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 8);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  EXPECT_EQ(s.scale(), 4);                        // min_scale
  EXPECT_EQ(s.update(true), Outcome::min_scale);  // nowhere left to go
  EXPECT_EQ(s.skipped(), 7);
}

TEST(LossScaler, StaticScaleSkipsOverflowsWithoutChanging) {
  auto p = dynamic_fp16(0, 1, 1, 1);
  p.loss_scaling = recipe::LossScaling::fixed;
  p.static_scale = 512;
  LossScaler s(p);
  EXPECT_EQ(s.update(true), Outcome::skipped);
  for (int i = 0; i < 5; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped(), 1);
}

TEST(LossScaler, Fp32AndBf16DoNotScale) {
  auto p = dynamic_fp16(16, 1, 1, 1);
  p.mode = recipe::PrecisionMode::bf16;
  LossScaler s(p);
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.scale(), 1);
}

// Steps 2, 3 and 7 see inf/NaN gradients: they are skipped (weights, optimizer state and the
// schedule untouched) and the run continues as if it had never seen those batches. With a static
// scale both runs scale every step alike, so the weights are equal to the last bit.
TEST(LossScaling, InjectedOverflowsAreSkippedAsIfTheBatchesWereNeverSeen) {
  auto loaded =
      testing::quickstart({"precision.mode=fp16", "precision.loss_scaling=static", "precision.static_scale=4096",
                           "scheduler.warmup_steps=4", "train.micro_batch_size=4"});
  const std::set<int64_t> poisoned{2, 3, 7};
  testing::Run injected = testing::run(loaded.recipe, 12, poisoned);
  for (int64_t step = 0; step < 12; ++step)
    EXPECT_EQ(injected.skipped[size_t(step)], poisoned.count(step) == 1) << step;
  testing::Run clean = testing::run(loaded.recipe, 9, {}, poisoned);
  ASSERT_EQ(clean.weights.size(), injected.weights.size());
  for (size_t p = 0; p < clean.weights.size(); ++p)
    EXPECT_EQ(injected.weights[p], clean.weights[p]) << "parameter " << p;
}

// The dynamic scale backs off and regrows as specified around the same injected overflows. (A clean
// run never backs off, so its fp16 gradients round at other scales and its weights differ by fp16
// rounding; the static-scale test above is the bit-exact comparison.)
TEST(LossScaling, DynamicScaleBacksOffAndRegrowsAroundInjectedOverflows) {
  auto loaded =
      testing::quickstart({"precision.mode=fp16", "precision.initial_scale_power=12", "precision.growth_interval=3",
                           "precision.hysteresis=2", "scheduler.warmup_steps=4", "train.micro_batch_size=4"});
  const std::set<int64_t> poisoned{2, 3, 7};
  testing::Run injected = testing::run(loaded.recipe, 12, poisoned);
  // 2: hysteresis spent; 3: back off; 4-6 clean: grow (hysteresis refilled); 7: hysteresis spent;
  // 8-10 clean: grow.
  const std::vector<double> expected_scales{4096, 4096, 4096, 4096, 2048, 2048, 2048, 4096, 4096, 4096, 4096, 8192};
  EXPECT_EQ(injected.loss_scales, expected_scales);
  for (int64_t step = 0; step < 12; ++step)
    EXPECT_EQ(injected.skipped[size_t(step)], poisoned.count(step) == 1) << step;
}

// A real overflow, not an injected one: the scale starts at 2^40, far past fp16's largest value
// (65504), so the scaled loss gradient overflows in the backward itself. Every such step is
// skipped and halves the scale (hysteresis 1) until the gradients fit; the weights stay at their
// initial values through the skipped steps, and from the first applied step on the run is, to
// the bit, a run that started at that scale and never saw the skipped steps' batches (so the
// optimizer state and the schedule were untouched too). The recovered scale sits just below the
// edge, so an occasional later step overflows again as the gradients grow: it is handled alike.
TEST(LossScaling, AHugeInitialScaleOverflowsForRealBacksOffAndTrainingContinues) {
  const std::vector<std::string> common{"precision.mode=fp16", "precision.hysteresis=1",
                                        "precision.growth_interval=1000", "scheduler.warmup_steps=4",
                                        "train.micro_batch_size=4"};
  auto with_power = [&](int power) {
    auto overrides = common;
    overrides.push_back("precision.initial_scale_power=" + std::to_string(power));
    return testing::quickstart(overrides);
  };
  auto huge = with_power(40);
  const int64_t steps = 40;
  testing::Run r = testing::run(huge.recipe, steps);
  int64_t k = 0;  // the leading overflowed steps
  while (k < steps && r.skipped[size_t(k)]) ++k;
  ASSERT_GT(k, 0) << "a loss scale of 2^40 did not overflow fp16";
  ASSERT_LT(k, 30) << "the scale never came back into fp16's range";
  EXPECT_EQ(r.loss_scales[0], std::ldexp(1.0, 40));
  int64_t later_overflows = 0;
  for (int64_t s = 1; s < steps; ++s) {
    EXPECT_EQ(r.loss_scales[size_t(s)], r.loss_scales[size_t(s - 1)] / (r.skipped[size_t(s - 1)] ? 2 : 1)) << s;
    later_overflows += s > k && r.skipped[size_t(s)];
  }
  EXPECT_LE(later_overflows, (steps - k) / 4) << "the backed-off scale keeps overflowing";

  EXPECT_EQ(testing::run(huge.recipe, k).weights, testing::run(huge.recipe, 0).weights)
      << "a skipped step changed the weights";

  std::set<int64_t> skipped_batches;
  for (int64_t s = 0; s < k; ++s) skipped_batches.insert(s);
  auto recovered = with_power(int(40 - k));
  testing::Run clean = testing::run(recovered.recipe, steps - k, {}, skipped_batches);
  EXPECT_EQ(std::vector<double>(r.losses.begin() + k, r.losses.end()), clean.losses);
  EXPECT_EQ(std::vector<bool>(r.skipped.begin() + k, r.skipped.end()), clean.skipped);
  ASSERT_EQ(clean.weights.size(), r.weights.size());
  for (size_t p = 0; p < clean.weights.size(); ++p) EXPECT_EQ(r.weights[p], clean.weights[p]) << "parameter " << p;
  EXPECT_LT(r.losses.back(), r.losses[size_t(k)] - 0.3) << "training did not continue after the overflows";
}

TEST(LossScaling, OverflowAtTheMinimumScaleAbortsWithAdvice) {
  auto loaded = testing::quickstart(
      {"precision.mode=fp16", "precision.initial_scale_power=0", "precision.hysteresis=1", "precision.min_scale=1"});
  try {
    testing::run(loaded.recipe, 3, {1});
    FAIL() << "expected the run to stop";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("minimum loss scale"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("precision.mode: bf16"), std::string::npos) << e.what();
  }
}

TEST(LossScaling, OverflowAtTheMinimumScaleCanFallBackToBf16) {
  auto loaded = testing::quickstart({"precision.mode=fp16", "precision.initial_scale_power=0", "precision.hysteresis=1",
                                     "precision.min_scale=1", "precision.on_min_scale=fallback"});
  testing::Run r = testing::run(loaded.recipe, 30, {1});
  EXPECT_TRUE(r.skipped[1]);
  for (size_t s = 2; s < r.losses.size(); ++s) {
    EXPECT_FALSE(r.skipped[s]) << s;
    EXPECT_EQ(r.loss_scales[s], 1) << s;
  }
  EXPECT_LT(r.losses.back(), r.losses.front() - 0.3);  // still learning, now in bf16
}

}  // namespace
}  // namespace engine
