// Exact resume under mpirun (2 ranks, every rank calling engine::train with the MPI communicator):
// a run cut after step k and resumed to N is the straight run, bit for bit, at every ZeRO stage, in
// fp32, bf16 and fp16 whose scale changes across the cut, with and without accumulation. And the
// world size changing across a resume: a world-2 stage-3 checkpoint continues in one process at
// stage 0 (rank 0 alone) as the world-2 run does, and a checkpoint whose global batch the new world
// cannot keep is refused with the arithmetic.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>

#include "../temp_dir.h"
#include "core/error.h"
#include "dist/communicator.h"
#include "mpi_test_util.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

class ExactResumeWorldTwo : public ::testing::TestWithParam<Case> {};

TEST_P(ExactResumeWorldTwo, CutAndResumedIsTheStraightRun) {
  const Case c = GetParam();
  const SharedDir dir("resume_w2");
  const std::vector<std::string> overrides = case_overrides(c);
  std::ostringstream log;
  train_here(tiny_recipe(dir / "straight", overrides, 2), log);
  TrainOptions cut;
  cut.stop_after = cut_of(c);
  train_here(tiny_recipe(dir / "cut", overrides, 2), log, cut);
  TrainOptions resume;
  resume.resume = "latest";
  const TrainSummary resumed = train_here(tiny_recipe(dir / "cut", overrides, 2), log, resume);
  EXPECT_EQ(resumed.resumed_from, cut_of(c));
  if (comm->rank() != 0) return;  // rank 0 writes the outputs
  const Trajectory straight = trajectory(dir / "straight" / "run");
  ASSERT_EQ(step_lines(straight.lines), size_t(kSteps)) << log.str();
  expect_same_run(trajectory(dir / "cut" / "run"), straight, "world 2, cut and resumed");
  expect_same_final_checkpoint(dir / "cut" / "run", dir / "straight" / "run", "world 2, cut and resumed");
  if (c.precision == "fp16") expect_scale_changes_after_cut(straight.lines, cut_of(c));
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsAccumulation, ExactResumeWorldTwo, ::testing::ValuesIn(all_cases()),
                         case_name);

// World 2 at stage 3 accumulating 2, cut, and continued by rank 0 alone at stage 0 accumulating 4
// (the global batch of 16 kept): the same bits as the world-2 run, since the ranks sum their
// micro-batches' gradients in the global order that one process accumulates them in.
TEST(Reshard, WorldTwoStageThreeContinuesInOneProcessAtStageZero) {
  const SharedDir dir("reshard_w1");
  const std::vector<std::string> w2 = {"distributed.zero_stage=3", "train.gradient_accumulation_steps=2"};
  std::ostringstream log;
  train_here(tiny_recipe(dir / "straight", w2, 2), log);
  TrainOptions cut;
  cut.stop_after = kCut;
  train_here(tiny_recipe(dir / "cut", w2, 2), log, cut);
  if (comm->rank() == 0) {
    TrainOptions resume;
    resume.resume = "latest";  // no communicator: this process alone
    const TrainSummary s = train(tiny_recipe(dir / "cut", {"distributed.zero_stage=0"}, 1), log, resume);
    EXPECT_EQ(s.resumed_from, kCut);
    EXPECT_NE(log.str().find("gradient_accumulation_steps 1 -> 4 keeps the global batch of 16"), std::string::npos)
        << log.str();
    expect_same_run(trajectory(dir / "cut" / "run"), trajectory(dir / "straight" / "run"),
                    "world 2 stage 3 -> world 1 stage 0");
  }
}

// A one-process checkpoint with a global batch of 12 (4 x 3) cannot continue at world 2: 12 is not
// a multiple of 4 x 2. Every rank refuses before training, with the arithmetic.
TEST(Reshard, AWorldThatCannotKeepTheGlobalBatchIsRefused) {
  const SharedDir dir("reshard_refused");
  std::ostringstream log;
  if (comm->rank() == 0) {
    TrainOptions cut;
    cut.stop_after = kCut;
    train(tiny_recipe(dir / "cut", {"train.gradient_accumulation_steps=3"}, 1), log, cut);
  }
  comm->barrier("the one-process checkpoint is written").wait();
  TrainOptions resume;
  resume.resume = "latest";
  std::string error;
  try {
    train_here(tiny_recipe(dir / "cut", {}, 2), log, resume);
  } catch (const UserError& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("cannot resume at world size 2: the checkpoint's global batch 12 (micro_batch_size 4 x "
                       "accumulation 3 x world size 1) is not a multiple of micro_batch_size 4 x world size 2 = 8"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace engine::testing

ENGINE_MPI_TEST_MAIN
