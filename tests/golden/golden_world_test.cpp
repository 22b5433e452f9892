// The world-size goldens: recipes/golden/gpt_zero{0,1,2,3}_world2 were recorded at two ranks, one
// per ZeRO stage. The stages share every bit of arithmetic, and two ranks of one micro-batch each add
// their gradients in the order one process accumulating both does, so all four files must hold
// gpt_accumulation's trajectory (one process, 2 micro-batches of 2) to the bit, weights included.
// The files are the engine's runs: ctest's golden_gpt_zero*_world2 checks rerun each under mpirun and
// compare it with its file (bitwise on the recording's machine type). Also: the world size's place in
// the file format.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "golden/golden.h"
#include "golden/golden_json.h"
#include "golden/variants.h"

namespace engine {
namespace {

const std::filesystem::path kGoldenDir = std::filesystem::path(ENGINE_SOURCE_DIR) / "recipes/golden";

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same_trajectory(const GoldenFile& want, const GoldenFile& got, const std::string& name) {
  ASSERT_EQ(want.trajectory.steps.size(), got.trajectory.steps.size()) << name;
  for (size_t i = 0; i < want.trajectory.steps.size(); ++i) {
    const StepMetrics &w = want.trajectory.steps[i], &g = got.trajectory.steps[i];
    EXPECT_EQ(w.step, g.step) << name;
    EXPECT_TRUE(same_bits(w.loss, g.loss)) << name << " step " << w.step << ": loss " << w.loss << " vs " << g.loss;
    EXPECT_TRUE(same_bits(w.grad_norm, g.grad_norm))
        << name << " step " << w.step << ": grad_norm " << w.grad_norm << " vs " << g.grad_norm;
    EXPECT_TRUE(same_bits(w.lr, g.lr)) << name << " step " << w.step << ": lr " << w.lr << " vs " << g.lr;
  }
  EXPECT_EQ(want.trajectory.weights_digest, got.trajectory.weights_digest) << name;
}

TEST(GoldenWorld, EveryZeroStageAtTwoRanksRecordedOneProcessAccumulatingTwoMicroBatches) {
  const GoldenFile one_process = read_golden(kGoldenDir / "gpt_accumulation.golden.json");
  EXPECT_EQ(one_process.world_size, 1);
  EXPECT_EQ(one_process.trajectory.steps.size(), 25u);
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string name = "gpt_zero" + std::to_string(stage) + "_world2";
    const GoldenFile golden = read_golden(kGoldenDir / (name + ".golden.json"));
    EXPECT_EQ(golden.world_size, 2) << name;
    EXPECT_EQ(golden.band.steps.size(), golden.trajectory.steps.size()) << name << " has no band";
    expect_same_trajectory(one_process, golden, name);
  }
}

TEST(GoldenWorld, WorldSizeIsWrittenAboveOneAndReadsAsOneWhenAbsent) {
  GoldenFile golden;
  golden.trajectory.steps = {{1, 3.0, 1.0, 0.1}};
  golden.trajectory.weights_digest = "00ff";
  EXPECT_FALSE(golden_to_json(golden).contains("world_size"));  // files of one process stay as they were
  EXPECT_EQ(golden_from_json(golden_to_json(golden)).world_size, 1);
  golden.world_size = 2;
  EXPECT_EQ(golden_to_json(golden).at("world_size"), 2);
  EXPECT_EQ(golden_from_json(golden_to_json(golden)).world_size, 2);
  for (const char* bad : {"0", "-2", "1.5", "\"2\""}) {
    nlohmann::ordered_json j = golden_to_json(golden);
    j["world_size"] = nlohmann::ordered_json::parse(bad);
    try {
      golden_from_json(j);
      ADD_FAILURE() << "world_size " << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("world_size is " + j["world_size"].dump()), std::string::npos) << e.what();
    }
  }
}

TEST(GoldenWorld, MissingMpirunSaysWhatToInstall) {
  try {
    find_mpirun("/nonexistent:/also/not/here");
    ADD_FAILURE() << "found an mpirun where there is none";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("apt-get install openmpi-bin"), std::string::npos) << e.what();
  }
  EXPECT_THROW(find_mpirun(""), UserError);
}

}  // namespace
}  // namespace engine
