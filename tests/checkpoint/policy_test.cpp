// When checkpoints are written and kept, what a resume accepts, and the manifest's piece map: the
// checkpoint section's behaviour in one process, against engine::train directly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/manifest.h"
#include "checkpoint/resume.h"
#include "checkpoint/sharded_state.h"
#include "core/error.h"
#include "recipe/export.h"
#include "recipe/load.h"
#include "recipe/schema.h"
#include "temp_dir.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

recipe::LoadedRecipe tiny(const fs::path& out, std::vector<std::string> overrides) {
  recipe::LoadOptions options;
  options.overrides = {"model.n_layer=1",   "model.n_embd=16",
                       "model.n_head=2",    "train.micro_batch_size=4",
                       "train.log_every=1", "run.output_dir=" + out.string(),
                       "run.name=t"};
  options.overrides.insert(options.overrides.end(), overrides.begin(), overrides.end());
  return recipe::load_recipe(fs::path(ENGINE_SOURCE_DIR) / "recipes/quickstart.yaml", options);
}

std::vector<int64_t> committed_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  for (const fs::path& p : committed_checkpoints(dir)) steps.push_back(read_manifest(p).step);
  return steps;
}

TEST(CheckpointPolicy, EveryStepsKeepsTheLastK) {
  const testing::TempDir scratch("policy");
  std::ostringstream out;
  train(tiny(scratch.path(), {"train.steps=10", "checkpoint.every_steps=3", "checkpoint.keep_last=2"}), out);
  EXPECT_EQ(committed_steps(scratch.path() / "t" / "checkpoints"), (std::vector<int64_t>{6, 9}));
  for (const auto& entry : fs::directory_iterator(scratch.path() / "t" / "checkpoints"))
    EXPECT_NE(entry.path().filename().string().rfind(".tmp-", 0), 0u) << entry.path();
}

TEST(CheckpointPolicy, KeepLastZeroKeepsAllAndAtEndAddsTheLastStep) {
  const testing::TempDir scratch("policy");
  std::ostringstream out;
  train(tiny(scratch.path(), {"train.steps=7", "checkpoint.every_steps=3", "checkpoint.keep_last=0",
                              "checkpoint.at_end=true", "checkpoint.async=false"}),
        out);
  EXPECT_EQ(committed_steps(scratch.path() / "t" / "checkpoints"), (std::vector<int64_t>{3, 6, 7}));
}

TEST(CheckpointPolicy, EveryMinutesUsesTheClock) {
  const testing::TempDir scratch("policy");
  std::ostringstream out;
  // 6 microseconds: due at every step end.
  train(tiny(scratch.path(), {"train.steps=4", "checkpoint.every_minutes=0.0000001", "checkpoint.keep_last=0"}), out);
  EXPECT_EQ(committed_steps(scratch.path() / "t" / "checkpoints"), (std::vector<int64_t>{1, 2, 3, 4}));
  // An hour: never within a short run.
  const testing::TempDir other("policy");
  train(tiny(other.path(), {"train.steps=4", "checkpoint.every_minutes=60"}), out);
  EXPECT_TRUE(committed_steps(other.path() / "t" / "checkpoints").empty());
}

TEST(CheckpointPolicy, UnfinishedWritesAreRemovedAndNeverResumedFrom) {
  const testing::TempDir scratch("policy");
  const fs::path dir = scratch.path() / "t" / "checkpoints";
  fs::create_directories(dir / ".tmp-step-50");
  std::ofstream(dir / ".tmp-step-50" / "rank-00000.bin") << "half";
  fs::create_directories(dir / "step-60");  // no manifest: not a checkpoint
  std::ostringstream out;
  const TrainSummary s = train(tiny(scratch.path(), {"train.steps=3", "checkpoint.resume=auto"}), out);
  EXPECT_EQ(s.resumed_from, 0);  // nothing complete to resume from
  EXPECT_FALSE(fs::exists(dir / ".tmp-step-50"));
  EXPECT_TRUE(fs::exists(dir / "step-60"));  // not ours to delete
}

TEST(CheckpointPolicy, AutoResumeContinuesAndNeverResumesPastTheEnd) {
  const testing::TempDir scratch("policy");
  std::ostringstream out;
  TrainOptions slice;
  slice.stop_after = 4;
  auto recipe = tiny(scratch.path(), {"train.steps=8", "checkpoint.resume=auto"});
  EXPECT_EQ(train(recipe, out, slice).steps, 4);
  const TrainSummary resumed = train(recipe, out);
  EXPECT_EQ(resumed.resumed_from, 4);
  EXPECT_EQ(resumed.steps, 8);
  // A checkpoint at the last step leaves nothing to train: said, not silently redone.
  train(tiny(scratch.path(), {"train.steps=8", "checkpoint.at_end=true", "run.name=u"}), out);
  TrainOptions latest;
  latest.resume = "latest";
  try {
    train(tiny(scratch.path(), {"train.steps=8", "run.name=u"}), out, latest);
    FAIL() << "resumed past train.steps";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("raise train.steps"), std::string::npos) << e.what();
  }
}

// Resuming from an older checkpoint starts another timeline: the newer checkpoints of the old one
// must never be what a later resume picks.
TEST(CheckpointPolicy, ResumingFromAnOlderCheckpointSetsTheNewerOnesAside) {
  const testing::TempDir scratch("policy");
  std::ostringstream out;
  const fs::path dir = scratch.path() / "t" / "checkpoints";
  train(tiny(scratch.path(), {"train.steps=8", "checkpoint.every_steps=2", "checkpoint.keep_last=0"}), out);
  ASSERT_EQ(committed_steps(dir), (std::vector<int64_t>{2, 4, 6, 8}));
  TrainOptions from_two;
  from_two.resume = (dir / "step-2").string();
  from_two.stop_after = 3;
  train(tiny(scratch.path(), {"train.steps=8", "checkpoint.every_steps=0", "checkpoint.resume=auto"}), out, from_two);
  EXPECT_EQ(committed_steps(dir), (std::vector<int64_t>{2, 3}));
  for (int step : {4, 6, 8}) EXPECT_TRUE(fs::exists(dir / ("abandoned-step-" + std::to_string(step)))) << step;
  // checkpoint.resume: auto now continues this timeline, from step 3.
  EXPECT_EQ(train(tiny(scratch.path(), {"train.steps=8", "checkpoint.resume=auto"}), out).resumed_from, 3);
}

TEST(ResumeRules, AcceptedChangesAreNotedAndRefusedOnesListedWithBothValues) {
  const testing::TempDir scratch("policy");
  auto yaml = [&](std::vector<std::string> o) {
    return recipe::dump_recipe(tiny(scratch.path(), o), recipe::Schema::engine(), false);
  };
  const std::string saved = yaml({"train.steps=10", "scheduler.warmup_steps=2"});
  const std::vector<std::string> notes = check_recipe_change(
      saved, yaml({"train.steps=20", "scheduler.warmup_steps=2", "scheduler.min_lr=0.0", "checkpoint.every_steps=5"}));
  std::string all;
  for (const std::string& n : notes) all += n + "\n";
  ASSERT_EQ(notes.size(), 2u) << all;  // steps and the schedule; checkpoint keys pass silently
  EXPECT_NE(notes[0].find("scheduler.min_lr"), std::string::npos) << notes[0];
  EXPECT_NE(notes[1].find("train.steps: 10 -> 20"), std::string::npos) << notes[1];
  try {
    check_recipe_change(saved, yaml({"train.steps=10", "scheduler.warmup_steps=2", "model.n_embd=32", "run.seed=7"}));
    FAIL() << "a different model was accepted";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.n_embd: 16 -> 32"), std::string::npos) << m;
    EXPECT_NE(m.find("run.seed: 1337 -> 7"), std::string::npos) << m;
  }
}

TEST(ResumeRules, ElasticAccumulationKeepsTheGlobalBatchOrRefusesWithTheArithmetic) {
  const testing::TempDir scratch("policy");
  recipe::Recipe r = tiny(scratch.path(), {"train.micro_batch_size=4"}).recipe;
  const nlohmann::json state{{"global_batch_size", 16}, {"world_size", 2}, {"gradient_accumulation_steps", 2}};
  std::vector<std::string> notes;
  keep_global_batch(r, state, 1, notes);
  EXPECT_EQ(*r.train.gradient_accumulation_steps, 4);
  EXPECT_EQ(*r.train.global_batch_size, 16);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("world size 2 -> 1"), std::string::npos) << notes[0];
  try {
    keep_global_batch(r, state, 3, notes);
    FAIL() << "a global batch of 16 cannot be kept at 3 ranks of 4";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of micro_batch_size 4 x world size 3 = 12"), std::string::npos)
        << e.what();
  }
}

// Every tensor's pieces cover it once, in order, inside its rank's file, at world sizes that do and
// do not divide the units evenly.
TEST(ManifestPieces, CoverEveryTensorOnceAtAnyWorldSize) {
  const testing::TempDir scratch("policy");
  const recipe::Recipe r = tiny(scratch.path(), {}).recipe;
  const CompiledStep compiled = compile_step(r, 1);
  const Graph& g = compiled.model.graph;
  for (int world : {1, 2, 3, 8}) {
    const int64_t file_bytes = rank_file_bytes(g, world, 3);
    const auto tensors = describe_tensors(g, world, {"master", "exp_avg", "exp_avg_sq"});
    ASSERT_EQ(tensors.size(), g.params().size() * 3);
    for (const CheckpointTensor& t : tensors) {
      int64_t next = 0;
      for (const CheckpointPiece& p : t.pieces) {
        EXPECT_EQ(p.first, next) << t.name;
        EXPECT_GE(p.file, 0);
        EXPECT_LT(p.file, world);
        EXPECT_LE(p.offset + p.count * 4, file_bytes) << t.name << " at world " << world;
        next += p.count;
      }
      EXPECT_EQ(next, t.numel()) << t.name << " at world " << world;
    }
  }
}

TEST(CheckpointPlan, TheSnapshotIsOneRanksFile) {
  const testing::TempDir scratch("policy");
  const recipe::Recipe r = tiny(scratch.path(), {}).recipe;
  // The units hold 2048 (embeddings), 3280 (the layer) and 32 (the final norm) parameters, each
  // padded to a multiple of world x 1024 elements; a rank's file holds AdamW's masters and two
  // moments (fp32) for its slice of each: world 1 pads to 2048 + 4096 + 1024 = 7168 elements,
  // world 2 to 2048 + 4096 + 2048 of which each rank holds half, 4096.
  const std::pair<int, int64_t> expected[] = {{1, 7168 * 3 * 4}, {2, 4096 * 3 * 4}};
  for (const auto& [world, bytes] : expected)
    EXPECT_EQ(compile_step(r, world).memory.checkpoint_snapshot, bytes) << "world " << world;
  // checkpoint.async: false writes the state straight to the file: no snapshot is held (with the
  // optimizer offloaded to host memory, one piece of it at a time).
  EXPECT_EQ(compile_step(tiny(scratch.path(), {"checkpoint.async=false"}).recipe).memory.checkpoint_snapshot, 0);
  EXPECT_EQ(compile_step(tiny(scratch.path(), {"checkpoint.async=false", "offload.optimizer=cpu"}).recipe)
                .memory.checkpoint_snapshot,
            kStreamPieceElements * 4);
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A synchronous checkpoint streams the state into the file; an asynchronous one writes a snapshot
// of it: the same bytes, as a resume reads them.
TEST(CheckpointPolicy, ASynchronousCheckpointWritesTheSnapshotsBytes) {
  for (const char* offload : {"none", "cpu"}) {
    const testing::TempDir sync("policy"), async("policy");
    std::ostringstream out;
    const std::vector<std::string> common{"train.steps=4", "checkpoint.every_steps=2", "checkpoint.keep_last=0",
                                          std::string("offload.optimizer=") + offload};
    auto with = [&](std::vector<std::string> overrides, const char* async_value) {
      overrides.push_back(std::string("checkpoint.async=") + async_value);
      return overrides;
    };
    train(tiny(sync.path(), with(common, "false")), out);
    train(tiny(async.path(), with(common, "true")), out);
    for (const char* step : {"step-2", "step-4"}) {
      const fs::path a = sync.path() / "t" / "checkpoints" / step / "rank-00000.bin";
      const fs::path b = async.path() / "t" / "checkpoints" / step / "rank-00000.bin";
      ASSERT_TRUE(fs::exists(a) && fs::exists(b)) << offload << " " << step;
      EXPECT_GT(fs::file_size(a), 0u);
      EXPECT_TRUE(file_bytes(a) == file_bytes(b)) << offload << " " << step;
    }
  }
}

}  // namespace
}  // namespace engine
