// 16-bit training against fp32 over 200 steps of the quick start. Its own executable: it is the
// slowest equivalence test, so the sanitizer build leaves it out (label `equivalence_slow`, which
// `ctest -L equivalence` still selects: labels are matched as regular expressions).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "run_util.h"

namespace engine {
namespace {

using testing::quickstart;
using testing::run;

// 16-bit training tracks fp32 over 200 steps of the quick start: the loss curves stay within
// a stated band of each other and the final validation losses agree closely.
TEST(Precision, SixteenBitRunsTrackFp32OverTwoHundredSteps) {
  auto fp32 = quickstart({"train.steps=200"});
  testing::Run reference = run(fp32.recipe, 200);
  for (const char* mode : {"precision.mode=bf16", "precision.mode=fp16"}) {
    auto low = quickstart({"train.steps=200", mode});
    testing::Run r = run(low.recipe, 200);
    double worst = 0, tail = 0;
    for (size_t s = 0; s < r.losses.size(); ++s) {
      ASSERT_TRUE(std::isfinite(r.losses[s])) << mode << " step " << s;
      worst = std::max(worst, std::abs(r.losses[s] - reference.losses[s]));
      if (s >= 150) tail += std::abs(r.losses[s] - reference.losses[s]) / 50;
    }
    EXPECT_LT(worst, 0.01) << mode;  // any single step (measured: bf16 0.0012, fp16 0.0001)
    EXPECT_LT(tail, 0.002) << mode;  // mean over the last 50 steps (measured: bf16 0.0003)
    std::printf("%s: largest per-step loss difference %.4f, mean over steps 150-199 %.5f\n", mode, worst, tail);
  }
}

}  // namespace
}  // namespace engine
