// The golden comparison: bitwise in the recording's environment, within the band elsewhere,
// non-finite classes, file round trips, and band derivation.
#include "golden/golden.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "../temp_dir.h"
#include "core/error.h"
#include "golden/golden_json.h"

namespace engine {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

Trajectory trajectory(std::vector<double> losses, std::vector<double> grad_norms = {}) {
  Trajectory t;
  for (size_t i = 0; i < losses.size(); ++i)
    t.steps.push_back({int64_t(i + 1), losses[i], grad_norms.empty() ? 1.0 : grad_norms[i], 0.1});
  t.weights_digest = "00ff";
  return t;
}

NumericEnvironment environment(const std::string& bf16_kernel = "brg:avx512_core_bf16") {
  NumericEnvironment env;
  env.compiler = "GNU 12.2.0";
  env.compiler_flags = "-O3";
  env.onednn = "2.6.3";
  env.cpu_isa = "avx512_core_bf16";
  env.matmul_kernels = {{"f32", "dnnl_sgemm (avx512_core_bf16)"}, {"bf16", bf16_kernel}, {"f16", "none"}};
  env.threads = 2;
  return env;
}

GoldenFile golden_of(Trajectory t, double rtol = 0) {
  GoldenFile golden{"0.1.0", "abc123", "h", environment(), {}, std::move(t), 1, {}};
  if (rtol > 0) golden.band.steps.assign(golden.trajectory.steps.size(), StepBand{rtol, rtol, rtol});
  return golden;
}

VariantRun variant(std::vector<double> losses) {
  Trajectory t = trajectory(std::move(losses));
  return {"v", environment("other"), t.steps, {}};
}

TEST(Golden, SameEnvironmentIsBitwiseAndCatchesTheSmallestChange) {
  GoldenFile golden = golden_of(trajectory({3.0, 2.5, 2.0, 1.5}), 1e-3);
  Comparison same = compare(golden, trajectory({3.0, 2.5, 2.0, 1.5}), environment());
  EXPECT_TRUE(same.ok);
  EXPECT_TRUE(same.bitwise);
  EXPECT_NE(same.mode.find("checked bitwise"), std::string::npos) << same.mode;
  Comparison c = compare(golden, trajectory({3.0, 2.5, std::nextafter(2.0, 3.0), 1.4}), environment());
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.report.find("first diverging step: 3 (loss)"), std::string::npos) << c.report;
  EXPECT_NE(c.report.find("loss: largest change 0.1"), std::string::npos) << c.report;
}

TEST(Golden, OtherEnvironmentIsCheckedWithinTheBandAndSaysWhy) {
  GoldenFile golden = golden_of(trajectory({3.0, 2.0}), 1e-3);
  const NumericEnvironment amx = environment("brg:avx512_core_amx");
  Comparison c = compare(golden, trajectory({3.002, 2.0}), amx);
  EXPECT_TRUE(c.ok) << c.report;
  EXPECT_FALSE(c.bitwise);
  EXPECT_NE(c.mode.find("environment differs: oneDNN bf16 matmul kernel brg:avx512_core_bf16 vs brg:avx512_core_amx"),
            std::string::npos)
      << c.mode;
  EXPECT_NE(c.mode.find("loss rtol up to 0.001"), std::string::npos) << c.mode;
  EXPECT_FALSE(compare(golden, trajectory({3.004, 2.0}), amx).ok);
  Trajectory other_weights = trajectory({3.0, 2.0});
  other_weights.weights_digest = "0100";  // the digest is a bitwise claim: not checked within a band
  EXPECT_TRUE(compare(golden, other_weights, amx).ok);
}

TEST(Golden, OtherEnvironmentWithoutABandFailsWithAClearMessage) {
  Comparison c = compare(golden_of(trajectory({3.0})), trajectory({3.0}), environment("other"));
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.mode.find("no tolerance band"), std::string::npos) << c.mode;
}

TEST(Golden, NonFiniteValuesMatchOnlyTheirOwnClass) {
  for (bool bitwise : {true, false}) {
    const NumericEnvironment here = bitwise ? environment() : environment("other");
    GoldenFile golden = golden_of(trajectory({3.0, 2.0, 1.0}, {kInf, kNaN, -kInf}), 0.5);
    EXPECT_TRUE(compare(golden, trajectory({3.0, 2.0, 1.0}, {kInf, kNaN, -kInf}), here).ok);
    EXPECT_FALSE(compare(golden, trajectory({3.0, 2.0, 1.0}, {kNaN, kNaN, -kInf}), here).ok);
    EXPECT_FALSE(compare(golden, trajectory({3.0, 2.0, 1.0}, {kInf, kInf, -kInf}), here).ok);
    EXPECT_FALSE(compare(golden, trajectory({3.0, 2.0, 1.0}, {kInf, kNaN, kInf}), here).ok);
    EXPECT_FALSE(compare(golden, trajectory({3.0, 2.0, 1.0}, {kInf, kNaN, 1.0}), here).ok);
    EXPECT_FALSE(compare(golden, trajectory({kNaN, 2.0, 1.0}, {kInf, kNaN, -kInf}), here).ok);
  }
}

TEST(Golden, FinalWeightsMustMatchBitwise) {
  Trajectory got = trajectory({3.0});
  got.weights_digest = "0100";
  Comparison c = compare(golden_of(trajectory({3.0})), got, environment());
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.report.find("final weights differ"), std::string::npos);
}

// Weights of two tensors; `scale` multiplies every value (a relative change of scale - 1).
WeightsFingerprint weights(double scale = 1) {
  std::vector<float> a(1000), b(64);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(scale * std::sin(double(i)));
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(scale * (0.01 + 1e-3 * double(i)));
  return {fingerprint_tensor("wte", a.data(), int64_t(a.size())), fingerprint_tensor("bias", b.data(), 64)};
}

// Off the recording's machine the final weights are checked by their fingerprint against the
// band's weights tolerance, where a run on this ISA measured it; elsewhere the mode says they were
// not checked and why.
TEST(Golden, OtherEnvironmentChecksTheFinalWeightsWithinTheirBand) {
  Trajectory recorded = trajectory({3.0, 2.0});
  recorded.weights = weights();
  GoldenFile golden = golden_of(recorded, 1e-3);
  golden.band.weights = {1e-4, 1e-4};
  golden.band.weights_isas = {"avx512_core_bf16"};
  const NumericEnvironment amx = environment("brg:avx512_core_amx");
  Trajectory close = trajectory({3.0, 2.0});
  close.weights = weights(1 + 5e-5);
  close.weights_digest = "0100";
  Comparison c = compare(golden, close, amx);
  EXPECT_TRUE(c.ok) << c.report;
  EXPECT_GT(c.band_used, 0.45) << c.mode;  // a relative change of 5e-5: its projections move 1 to 2x as much
  EXPECT_LT(c.band_used, 1) << c.mode;
  EXPECT_NE(c.mode.find("final weights rtol up to 0.0001"), std::string::npos) << c.mode;
  Trajectory far = close;
  far.weights[1] = weights(1 + 3e-4)[1];  // one tensor moved three bands
  c = compare(golden, far, amx);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.report.find("final weights: bias changed by 0.0003"), std::string::npos) << c.report;
  // A machine whose ISA no run measured: not judged, and said so.
  NumericEnvironment avx2 = amx;
  avx2.cpu_isa = "avx2";
  c = compare(golden, far, avx2);
  EXPECT_TRUE(c.ok) << c.report;
  EXPECT_NE(c.mode.find("final weights not checked: no run on avx2 measured them"), std::string::npos) << c.mode;
  // The band is the safety factor times the runs' largest deviation, on their ISAs.
  Band band;
  band.rule.safety_factor = 4;
  VariantRun run = variant({3.0, 2.0});
  run.weights = weights(1 + 2e-5);
  run.environment.cpu_isa = "avx2";
  VariantRun unmeasured = variant({3.0, 2.0});  // an observed run from before fingerprints
  unmeasured.environment.cpu_isa = "avx512_core_amx";
  widen_weights_band(band, recorded.weights, "avx512_core_bf16", {run, unmeasured});
  const std::vector<double> deviations = tensor_deviations(recorded.weights, run.weights);
  ASSERT_EQ(band.weights.size(), 2u);
  for (size_t t = 0; t < 2; ++t) {
    EXPECT_GE(deviations[t], 2e-5 * 0.99);  // the rms moved by 2e-5 relative, a projection as much or more
    EXPECT_LE(deviations[t], 2e-5 * 4);
    EXPECT_DOUBLE_EQ(band.weights[t], 4 * deviations[t]);
  }
  EXPECT_EQ(band.weights_isas, (std::vector<std::string>{"avx512_core_bf16", "avx2"}));
}

TEST(Golden, DifferentStepCountIsARegression) {
  EXPECT_FALSE(compare(golden_of(trajectory({3.0, 2.0})), trajectory({3.0}), environment()).ok);
  EXPECT_FALSE(compare(golden_of(trajectory({3.0, 2.0}), 0.1), trajectory({3.0}), environment("other")).ok);
}

TEST(Golden, FilesRoundTripEveryFieldAndNonFiniteClass) {
  const testing::TempDir dir("golden");
  GoldenFile golden = golden_of(trajectory({3.0, 2.0, 1.0}, {kInf, kNaN, -kInf}), 1e-5);
  golden.band.variants = {"ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1: avx2"};
  golden.trajectory.weights = weights();
  golden.band.weights = {2e-5, 3e-5};
  golden.band.weights_isas = {"avx2", "avx512_core"};
  write_golden(dir / "g.golden.json", golden);
  GoldenFile back = read_golden(dir / "g.golden.json");
  EXPECT_EQ(back.engine_commit, "abc123");
  EXPECT_TRUE(back.environment.differences(golden.environment).empty());
  EXPECT_EQ(back.band.variants, golden.band.variants);
  EXPECT_EQ(back.band.weights, golden.band.weights);
  EXPECT_EQ(back.band.weights_isas, golden.band.weights_isas);
  ASSERT_EQ(back.trajectory.weights.size(), 2u);
  EXPECT_EQ(back.trajectory.weights[1].tensor, "bias");
  EXPECT_EQ(back.trajectory.weights[1].rms, golden.trajectory.weights[1].rms);
  EXPECT_EQ(back.trajectory.weights[0].sketch, golden.trajectory.weights[0].sketch);
  ASSERT_EQ(back.band.steps.size(), 3u);
  EXPECT_DOUBLE_EQ(back.band.steps[1].grad_norm, 1e-5);
  EXPECT_TRUE(std::isinf(back.trajectory.steps[0].grad_norm) && back.trajectory.steps[0].grad_norm > 0);
  EXPECT_TRUE(std::isnan(back.trajectory.steps[1].grad_norm));
  EXPECT_TRUE(std::isinf(back.trajectory.steps[2].grad_norm) && back.trajectory.steps[2].grad_norm < 0);
  EXPECT_TRUE(compare(back, golden.trajectory, golden.environment).ok);
}

TEST(Golden, MalformedAndOlderFilesAreRefusedWithAClearMessage) {
  const testing::TempDir dir("golden");
  std::ofstream(dir / "bad.golden.json") << "{\"steps\": 5}";
  EXPECT_THROW(read_golden(dir / "bad.golden.json"), UserError);
  EXPECT_THROW(read_golden(dir / "missing.golden.json"), UserError);
  std::ofstream(dir / "old.golden.json") << "{\"engine_version\": \"0.1.0\", \"steps\": []}";
  try {
    read_golden(dir / "old.golden.json");
    FAIL() << "a format-1 file was read";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("engine golden update"), std::string::npos) << e.what();
  }
  nlohmann::ordered_json j = golden_to_json(golden_of(trajectory({3.0})));
  j["steps"][0]["loss"] = "infinite";
  std::ofstream(dir / "word.golden.json") << j.dump();
  EXPECT_THROW(read_golden(dir / "word.golden.json"), UserError);
  EXPECT_EQ(golden_path("recipes/golden/gpt.yaml"), std::filesystem::path("recipes/golden/gpt.golden.json"));
}

TEST(GoldenBand, IsTheSafetyFactorTimesTheRunningSpreadWithLookaheadAndFloor) {
  const Trajectory recorded = trajectory({1.0, 1.0, 1.0, 1.0, 1.0});
  BandRule rule{.safety_factor = 10, .lookahead = 1, .floor = 1e-6};
  Band band = derive_band(recorded.steps, {variant({1.0, 1.0, 1.0 + 1e-4, 1.0, 1.0 - 1e-3})}, rule);
  ASSERT_EQ(band.steps.size(), 5u);
  EXPECT_DOUBLE_EQ(band.steps[0].loss, 1e-6);    // nothing moved by step 2: the floor
  EXPECT_NEAR(band.steps[1].loss, 1e-3, 1e-12);  // the lookahead sees step 3's 1e-4
  EXPECT_NEAR(band.steps[2].loss, 1e-3, 1e-12);
  EXPECT_NEAR(band.steps[3].loss, 1e-2, 1e-12);  // step 5's 1e-3, one step early
  EXPECT_NEAR(band.steps[4].loss, 1e-2, 1e-12);
  EXPECT_DOUBLE_EQ(band.steps[0].grad_norm, 1e-6);
  // The widest variant wins at every step.
  Band two =
      derive_band(recorded.steps, {variant({1.0, 1.0, 1.0, 1.0, 1.0}), variant({1.0, 1.0, 1.0, 1.0, 1.1})}, rule);
  EXPECT_NEAR(two.steps[4].loss, 1.0, 1e-12);
}

TEST(GoldenBand, RefusesVariantsThatAreNotComparable) {
  const Trajectory recorded = trajectory({1.0, 1.0});
  EXPECT_THROW(derive_band(recorded.steps, {variant({1.0})}, BandRule{}), UserError);
  EXPECT_THROW(derive_band(recorded.steps, {variant({1.0, kNaN})}, BandRule{}), UserError);
}

}  // namespace
}  // namespace engine
