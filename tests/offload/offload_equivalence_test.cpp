// Offload changes where state lives, never what training computes: every offload choice trains
// bit-identically to no offload (every logged loss, learning rate, gradient norm and validation
// loss, and the final weights file), and its checkpoints resume exactly, with or without offload.
// Each offloaded run also shows it took the offload path (its chunk and swap counters).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "../temp_dir.h"
#include "offload_util.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

class OffloadEquivalence : public ::testing::TestWithParam<OffloadCase> {};

TEST_P(OffloadEquivalence, TrainsTheBitsOfNoOffload) {
  const OffloadCase c = GetParam();
  const TempDir dir("offload");
  fs::create_directories(dir / "swap");
  std::ostringstream log;
  train(tiny_recipe(dir / "reference", reference_overrides(c)), log);
  train(tiny_recipe(dir / "offloaded", offload_overrides(c, dir / "swap")), log);
  expect_same_run(offload_trajectory(dir / "offloaded" / "run"), offload_trajectory(dir / "reference" / "run"),
                  "offloaded");
  expect_offloaded(dir / "offloaded" / "run", c);
  EXPECT_TRUE(fs::is_empty(dir / "swap")) << "swap files are removed at the end of the run";
  if (c.optimizer == "nvme" || c.parameters == "nvme") {
    EXPECT_NE(log.str().find("swap file"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Choices, OffloadEquivalence, ::testing::ValuesIn(offload_cases()), offload_case_name);

// SGD keeps one state tensor with momentum and none without (then only the masters, or nothing,
// move): both still match.
TEST(OffloadEquivalence, SgdWithAndWithoutMomentum) {
  for (const char* momentum : {"0.9", "0"}) {
    const TempDir dir("offload-sgd");
    fs::create_directories(dir / "swap");
    std::ostringstream log;
    const OffloadCase c{1, "nvme", "none", "bf16"};
    std::vector<std::string> sgd = {"optimizer.type=sgd", std::string("optimizer.momentum=") + momentum,
                                    "optimizer.lr=0.05"};
    auto with = [&](std::vector<std::string> o) {
      o.insert(o.end(), sgd.begin(), sgd.end());
      return o;
    };
    train(tiny_recipe(dir / "reference", with(reference_overrides(c))), log);
    train(tiny_recipe(dir / "offloaded", with(offload_overrides(c, dir / "swap"))), log);
    expect_same_run(offload_trajectory(dir / "offloaded" / "run"), offload_trajectory(dir / "reference" / "run"),
                    std::string("sgd, momentum ") + momentum);
  }
}

// Checkpoints of offloaded state (streamed from the swap file) resume exactly, into a run with the
// same offload or none, and a checkpoint without offload resumes into an offloaded run.
TEST(OffloadResume, CheckpointsCrossOffloadChoices) {
  const OffloadCase c{3, "nvme", "nvme", "bf16"};
  const TempDir dir("offload-resume");
  fs::create_directories(dir / "swap");
  std::ostringstream log;
  train(tiny_recipe(dir / "straight", reference_overrides(c)), log);
  const Trajectory straight = offload_trajectory(dir / "straight" / "run");
  struct Leg {
    std::string name;
    bool first_offloaded, second_offloaded;
  };
  for (const Leg& leg :
       {Leg{"nvme-to-nvme", true, true}, Leg{"nvme-to-none", true, false}, Leg{"none-to-nvme", false, true}}) {
    const fs::path out = dir / leg.name;
    TrainOptions cut;
    cut.stop_after = kCut;
    auto overrides = [&](bool offloaded) {
      return offloaded ? offload_overrides(c, dir / "swap") : reference_overrides(c);
    };
    train(tiny_recipe(out, overrides(leg.first_offloaded)), log, cut);
    TrainOptions resume;
    resume.resume = "latest";
    const TrainSummary done = train(tiny_recipe(out, overrides(leg.second_offloaded)), log, resume);
    EXPECT_EQ(done.resumed_from, kCut) << leg.name;
    expect_same_run(offload_trajectory(out / "run"), straight, leg.name);
  }
}

}  // namespace
}  // namespace engine::testing
