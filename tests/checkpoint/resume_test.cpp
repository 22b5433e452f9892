// Exact resume in one process: a run cut after step k (TrainOptions::stop_after) and resumed to
// step N is the straight N-step run, bit for bit (every logged loss, learning rate, gradient norm,
// loss scale and validation loss, the final weights file, and the checkpoint after step N with its
// optimizer state), at every ZeRO stage (at world 1 the
// stage still changes the plan the state is kept in), in fp32, bf16 and fp16 whose loss scale
// backs off and grows across the cut, with and without gradient accumulation. And what resuming
// refuses (a changed model) and accepts with a note (more steps, another schedule), and plugins:
// engine.request_checkpoint writes a full checkpoint, on_checkpoint sees it committed, and `saved`
// comes back on resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "../temp_dir.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "core/error.h"
#include "resume_util.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

class ExactResume : public ::testing::TestWithParam<Case> {};

TEST_P(ExactResume, CutAndResumedIsTheStraightRun) {
  const Case c = GetParam();
  const int64_t at = cut_of(c);
  const TempDir dir("resume");
  const std::vector<std::string> overrides = case_overrides(c);
  std::ostringstream log;

  train(tiny_recipe(dir / "straight", overrides), log);
  const Trajectory straight = trajectory(dir / "straight" / "run");
  ASSERT_EQ(step_lines(straight.lines), size_t(kSteps)) << log.str();

  TrainOptions cut;
  cut.stop_after = at;
  const TrainSummary first = train(tiny_recipe(dir / "cut", overrides), log, cut);
  EXPECT_EQ(first.steps, at);
  EXPECT_FALSE(first.interrupted);
  EXPECT_EQ(first.last_checkpoint, dir / "cut" / "run" / "checkpoints" / ("step-" + std::to_string(at)));
  ASSERT_TRUE(fs::exists(first.last_checkpoint / kManifestName)) << log.str();

  TrainOptions resume;
  resume.resume = "latest";
  const TrainSummary second = train(tiny_recipe(dir / "cut", overrides), log, resume);
  EXPECT_EQ(second.resumed_from, at);
  EXPECT_EQ(second.steps, kSteps);
  const std::string what = "cut at step " + std::to_string(at) + " and resumed";
  expect_same_run(trajectory(dir / "cut" / "run"), straight, what);
  expect_same_final_checkpoint(dir / "cut" / "run", dir / "straight" / "run", what);
  EXPECT_EQ(second.skipped_steps, overflows(straight.lines));
  if (c.precision == "fp16") expect_scale_changes_after_cut(straight.lines, at);
}

INSTANTIATE_TEST_SUITE_P(StagesPrecisionsAccumulation, ExactResume, ::testing::ValuesIn(all_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Lora, ExactResume, ::testing::ValuesIn(lora_cases()), case_name);

// A checkpoint written at one stage resumes at another: the state is kept whole, whatever the plan.
TEST(Reshard, StageThreeCheckpointResumesAtStageZero) {
  const TempDir dir("restage");
  std::ostringstream log;
  train(tiny_recipe(dir / "straight", {"distributed.zero_stage=3"}), log);
  TrainOptions cut;
  cut.stop_after = kCut;
  train(tiny_recipe(dir / "cut", {"distributed.zero_stage=3"}), log, cut);
  TrainOptions resume;
  resume.resume = "latest";
  train(tiny_recipe(dir / "cut", {"distributed.zero_stage=0"}), log, resume);
  expect_same_run(trajectory(dir / "cut" / "run"), trajectory(dir / "straight" / "run"), "stage 3 -> stage 0");
}

// ---- what a resumed run may change ----

// Cuts a default tiny run at step kCut and returns the message of the UserError the resume with
// `overrides` throws ("" when it trains), and what it printed.
struct Outcome {
  std::string error;
  std::string log;
};
Outcome resume_with(const TempDir& dir, const std::vector<std::string>& overrides) {
  std::ostringstream log;
  TrainOptions cut;
  cut.stop_after = kCut;
  train(tiny_recipe(dir / "cut", {}), log, cut);
  TrainOptions resume;
  resume.resume = "latest";
  std::ostringstream resumed;
  try {
    train(tiny_recipe(dir / "cut", overrides), resumed, resume);
  } catch (const UserError& e) {
    return {e.what(), resumed.str()};
  }
  return {"", resumed.str()};
}

TEST(RecipeChange, ANewModelWidthIsRefusedNamingTheKeyAndBothValues) {
  const TempDir dir("refused");
  const Outcome o = resume_with(dir, {"model.n_embd=64"});
  EXPECT_NE(o.error.find("model.n_embd: 32 -> 64"), std::string::npos) << o.error;
  EXPECT_NE(o.error.find("the checkpoint holds another model"), std::string::npos) << o.error;
}

TEST(RecipeChange, MoreStepsAndAnotherScheduleAreAcceptedWithANote) {
  const TempDir dir("accepted");
  const Outcome o = resume_with(dir, {"train.steps=10", "scheduler.min_lr=0.0001"});
  EXPECT_EQ(o.error, "");
  EXPECT_NE(o.log.find("resume: train.steps: 8 -> 10"), std::string::npos) << o.log;
  EXPECT_NE(o.log.find("resume: scheduler.min_lr: 3e-04 -> 1e-04"), std::string::npos) << o.log;
  const Trajectory t = trajectory(dir / "cut" / "run");
  ASSERT_FALSE(t.lines.empty());
  EXPECT_EQ(t.lines.back().at("step"), 10);
}

// The micro-batch size counts the saved data position: changing it would replay or skip data.
TEST(RecipeChange, AnotherMicroBatchSizeIsRefused) {
  const TempDir dir("micro");
  const Outcome o = resume_with(dir, {"train.micro_batch_size=2", "train.gradient_accumulation_steps=2"});
  EXPECT_NE(o.error.find("train.micro_batch_size: 4 -> 2"), std::string::npos) << o.error;
}

// A checkpoint written before the engine had a key resumes when the key is at its default (a run
// from before LoRA, whose recipe has no lora section); a value that changes the run is refused.
TEST(RecipeChange, AKeyTheCheckpointPredatesIsAcceptedAtItsDefaultOnly) {
  const std::string saved = "model:\n  n_embd: 32\n";
  EXPECT_NO_THROW(check_recipe_change(saved, saved + "lora:\n  rank: 0\n  alpha: 8.0\n"));
  try {
    check_recipe_change(saved, saved + "lora:\n  rank: 4\n");
    ADD_FAILURE() << "a LoRA rank the checkpoint never had was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("lora.rank: (absent) -> 4"), std::string::npos) << e.what();
  }
}

// A LoRA checkpoint holds the adapters, and the digest of the frozen base they were trained over: a
// resume whose model.init_from file now holds other weights (rewritten in place) is refused,
// naming it; over the same file it resumes.
TEST(RecipeChange, ALoraRunResumedOverAnotherBaseIsRefused) {
  const TempDir dir("lora_base");
  std::ostringstream log;
  train(tiny_recipe(dir / "one", {"train.steps=1"}), log);  // two bases of the model's shape
  train(tiny_recipe(dir / "two", {"train.steps=2"}), log);
  const fs::path base = dir / "base.safetensors";
  fs::copy_file(dir / "one" / "run" / "model.safetensors", base);
  std::vector<std::string> lora = kLoraOverrides;
  lora.push_back("model.init_from=" + base.string());
  TrainOptions cut;
  cut.stop_after = kCut;
  train(tiny_recipe(dir / "cut", lora), log, cut);
  TrainOptions resume;
  resume.resume = "latest";
  fs::copy_file(dir / "two" / "run" / "model.safetensors", base, fs::copy_options::overwrite_existing);
  try {
    train(tiny_recipe(dir / "cut", lora), log, resume);
    ADD_FAILURE() << "resumed over another base";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("trained over other frozen base weights"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.init_from " + base.string()), std::string::npos) << e.what();
  }
  fs::copy_file(dir / "one" / "run" / "model.safetensors", base, fs::copy_options::overwrite_existing);
  const TrainSummary resumed = train(tiny_recipe(dir / "cut", lora), log, resume);
  EXPECT_EQ(resumed.resumed_from, kCut);
}

}  // namespace
}  // namespace engine::testing
