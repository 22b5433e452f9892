// The checkpoint tools against real checkpoints written by `engine train`: `engine checkpoint
// list`, `inspect` and `verify` (which must name a flipped byte or a truncated rank file, exit 2),
// and `engine export` from a checkpoint, whose weights at the run's last step must be the run's
// final model.safetensors exactly, at one process and at two ranks under ZeRO stage 3.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "../temp_dir.h"
#include "checkpoint/safetensors.h"

namespace engine {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string output;  // stdout and stderr
};

Result run(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

Result engine(const std::string& arguments) { return run("OMP_NUM_THREADS=1 '" ENGINE_BINARY "' " + arguments); }

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

// A quick-start run of `steps` steps with a checkpoint every 3 and one at the end.
std::string train_arguments(const fs::path& out, int steps) {
  return "train '" ENGINE_SOURCE_DIR "/recipes/quickstart.yaml' run.output_dir=" + quoted(out) +
         " train.steps=" + std::to_string(steps) +
         " train.eval_every=0 checkpoint.every_steps=3 checkpoint.at_end=true checkpoint.keep_last=0";
}

// Every tensor's name, shape and bytes, and the metadata, are the same.
void expect_same_weights(const fs::path& a, const fs::path& b) {
  const SafetensorsFile x = read_safetensors(a), y = read_safetensors(b);
  EXPECT_EQ(x.metadata, y.metadata);
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (const auto& [name, tensor] : x.tensors) {
    auto it = y.tensors.find(name);
    ASSERT_NE(it, y.tensors.end()) << name;
    EXPECT_EQ(tensor.shape, it->second.shape) << name;
    EXPECT_TRUE(tensor.data == it->second.data) << name << " differs";
  }
}

void flip_byte(const fs::path& file, std::streamoff at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

// One training run shared by the tests: 7 steps, checkpoints at steps 3, 6 and 7 (the end).
class CheckpointTools : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    scratch_ = std::make_unique<testing::TempDir>("checkpoint_tools");
    const Result trained = engine(train_arguments(scratch_->path(), 7));
    ASSERT_EQ(trained.status, 0) << trained.output;
  }
  static void TearDownTestSuite() { scratch_.reset(); }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(run_dir() / "model.safetensors")) << "the shared training run failed";
  }

  static fs::path run_dir() { return scratch_->path() / "quickstart"; }
  static fs::path checkpoints() { return run_dir() / "checkpoints"; }
  // A copy of the checkpoint directory that a test may damage.
  static fs::path copy_checkpoints(const testing::TempDir& into) {
    const fs::path copy = into / "checkpoints";
    fs::copy(checkpoints(), copy, fs::copy_options::recursive);
    return copy;
  }

  static std::unique_ptr<testing::TempDir> scratch_;
};
std::unique_ptr<testing::TempDir> CheckpointTools::scratch_;

TEST_F(CheckpointTools, ListShowsEveryCheckpointAndIgnoresUnfinishedWrites) {
  const testing::TempDir scratch("checkpoint_list");
  const fs::path dir = copy_checkpoints(scratch);
  fs::create_directory(dir / ".tmp-step-9");  // a write that a crash interrupted
  fs::remove(dir / "step-3" / "manifest.json");
  fs::rename(dir / "step-3", dir / ".tmp-step-3");
  const Result listed = engine("checkpoint list " + quoted(dir));
  ASSERT_EQ(listed.status, 0) << listed.output;
  EXPECT_NE(listed.output.find("step-6"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("step-7"), std::string::npos) << listed.output;
  EXPECT_EQ(listed.output.find("step-3\n"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find(".tmp-step-3: incomplete, ignored"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find(".tmp-step-9: incomplete, ignored"), std::string::npos) << listed.output;
  // A row: step, world size, ZeRO stage.
  EXPECT_NE(listed.output.find("       7      1     0  "), std::string::npos) << listed.output;

  // A run directory lists its checkpoints/.
  const Result from_run = engine("checkpoint list " + quoted(run_dir()));
  ASSERT_EQ(from_run.status, 0) << from_run.output;
  EXPECT_NE(from_run.output.find("step-3"), std::string::npos) << from_run.output;
  EXPECT_NE(from_run.output.find(checkpoints().string()), std::string::npos) << from_run.output;

  const Result missing = engine("checkpoint list " + quoted(scratch / "nothing"));
  EXPECT_EQ(missing.status, 2) << missing.output;
}

TEST_F(CheckpointTools, InspectSummarisesOneCheckpoint) {
  const Result shown = engine("checkpoint inspect " + quoted(checkpoints() / "step-6"));
  ASSERT_EQ(shown.status, 0) << shown.output;
  for (const char* expected : {"step            6", "world size      1, ZeRO stage 0", "updates         6",
                               "data position   6 micro-batches", "global batch    16 = 16 micro x 1 accumulation x 1",
                               "rank-00000.bin", "xxh3 ", "master", "exp_avg ", "exp_avg_sq"})
    EXPECT_NE(shown.output.find(expected), std::string::npos) << "no '" << expected << "' in\n" << shown.output;
  const Result not_one = engine("checkpoint inspect " + quoted(checkpoints()));
  EXPECT_EQ(not_one.status, 2) << not_one.output;
  EXPECT_NE(not_one.output.find("manifest.json"), std::string::npos) << not_one.output;
}

TEST_F(CheckpointTools, VerifyPassesIntactCheckpoints) {
  const Result one = engine("checkpoint verify " + quoted(checkpoints() / "step-6"));
  EXPECT_EQ(one.status, 0) << one.output;
  EXPECT_NE(one.output.find("rank-00000.bin  OK"), std::string::npos) << one.output;
  const Result all = engine("checkpoint verify " + quoted(run_dir()));
  EXPECT_EQ(all.status, 0) << all.output;
  EXPECT_NE(all.output.find("3 checkpoints OK"), std::string::npos) << all.output;
}

TEST_F(CheckpointTools, VerifyNamesAFileWithAFlippedByte) {
  const testing::TempDir scratch("checkpoint_flip");
  const fs::path dir = copy_checkpoints(scratch);
  const fs::path damaged = dir / "step-6" / "rank-00000.bin";
  flip_byte(damaged, std::streamoff(fs::file_size(damaged) / 2));
  const Result one = engine("checkpoint verify " + quoted(dir / "step-6"));
  EXPECT_EQ(one.status, 2) << one.output;
  EXPECT_NE(one.output.find(damaged.string() + ": corrupted"), std::string::npos) << one.output;
  // Every checkpoint of a directory is verified; the intact ones still say OK.
  const Result all = engine("checkpoint verify " + quoted(dir));
  EXPECT_EQ(all.status, 2) << all.output;
  EXPECT_NE(all.output.find(damaged.string() + ": corrupted"), std::string::npos) << all.output;
  EXPECT_NE(all.output.find("1 file is damaged"), std::string::npos) << all.output;
  // Export reads the same files and refuses the damaged one too.
  const Result exported = engine("export " + quoted(dir / "step-6") + " " + quoted(scratch / "w.safetensors"));
  EXPECT_EQ(exported.status, 2) << exported.output;
  EXPECT_NE(exported.output.find("checksum"), std::string::npos) << exported.output;
}

TEST_F(CheckpointTools, VerifyNamesATruncatedFile) {
  const testing::TempDir scratch("checkpoint_truncate");
  const fs::path dir = copy_checkpoints(scratch);
  const fs::path damaged = dir / "step-3" / "rank-00000.bin";
  fs::resize_file(damaged, fs::file_size(damaged) - 100);
  const Result one = engine("checkpoint verify " + quoted(dir / "step-3"));
  EXPECT_EQ(one.status, 2) << one.output;
  EXPECT_NE(one.output.find(damaged.string() + ": wrong size"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("(truncated)"), std::string::npos) << one.output;
  fs::remove(damaged);
  const Result missing = engine("checkpoint verify " + quoted(dir / "step-3"));
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_NE(missing.output.find(damaged.string()), std::string::npos) << missing.output;
}

TEST_F(CheckpointTools, ExportOfTheLastCheckpointIsTheFinalModel) {
  const testing::TempDir scratch("checkpoint_export");
  const fs::path out = scratch / "step-7.safetensors";
  const Result exported = engine("export " + quoted(checkpoints() / "step-7") + " " + quoted(out));
  ASSERT_EQ(exported.status, 0) << exported.output;
  expect_same_weights(out, run_dir() / "model.safetensors");

  // A directory of checkpoints exports its latest.
  const fs::path latest = scratch / "latest.safetensors";
  ASSERT_EQ(engine("export " + quoted(checkpoints()) + " " + quoted(latest)).status, 0);
  expect_same_weights(latest, run_dir() / "model.safetensors");

  // An earlier checkpoint holds earlier weights.
  const fs::path earlier = scratch / "step-3.safetensors";
  ASSERT_EQ(engine("export " + quoted(checkpoints() / "step-3") + " " + quoted(earlier)).status, 0);
  const SafetensorsFile early = read_safetensors(earlier), final = read_safetensors(run_dir() / "model.safetensors");
  EXPECT_EQ(early.metadata.at("steps"), "3");
  EXPECT_FALSE(early.tensors.at("wte.weight").data == final.tensors.at("wte.weight").data);

  // A run directory without final weights (a preempted run) exports its latest checkpoint.
  const fs::path run = scratch / "run";
  fs::create_directory(run);
  fs::copy(checkpoints(), run / "checkpoints", fs::copy_options::recursive);
  const fs::path preempted = scratch / "preempted.safetensors";
  const Result from_run = engine("export " + quoted(run) + " " + quoted(preempted));
  ASSERT_EQ(from_run.status, 0) << from_run.output;
  expect_same_weights(preempted, run_dir() / "model.safetensors");
}

TEST(CheckpointToolsHelp, TheCommandsAreExplained) {
  const Result topic = engine("help checkpoints");
  EXPECT_EQ(topic.status, 0) << topic.output;
  for (const char* expected : {"engine checkpoint list", "engine checkpoint inspect", "engine checkpoint verify",
                               "engine export CKPT|DIR", ".tmp-step-N"})
    EXPECT_NE(topic.output.find(expected), std::string::npos) << "no '" << expected << "' in\n" << topic.output;
  const Result overview = engine("help");
  EXPECT_NE(overview.output.find("engine checkpoint list|inspect|verify"), std::string::npos) << overview.output;
  const Result usage = engine("checkpoint verify --help");
  EXPECT_EQ(usage.status, 0) << usage.output;
  EXPECT_NE(usage.output.find("checksum"), std::string::npos) << usage.output;
  EXPECT_EQ(engine("checkpoint").status, 2);  // a subcommand is required
}

// Written by two ranks at ZeRO stage 3 (every parameter in pieces across both files), exported by
// one process.
TEST(CheckpointToolsDistributed, ExportOfAZero3CheckpointIsTheFinalModel) {
  const testing::TempDir scratch("checkpoint_zero3");
  const Result trained =
      run(std::string("OMP_NUM_THREADS=1 " MPIEXEC " --allow-run-as-root --oversubscribe ") + MPIEXEC_NUMPROC_FLAG +
          " 2 '" ENGINE_BINARY "' " + train_arguments(scratch.path(), 4) + " distributed.zero_stage=3");
  ASSERT_EQ(trained.status, 0) << trained.output;
  const fs::path run_dir = scratch / "quickstart", checkpoint = run_dir / "checkpoints" / "step-4";
  ASSERT_TRUE(fs::exists(checkpoint / "rank-00001.bin"));
  const Result shown = engine("checkpoint inspect " + quoted(checkpoint));
  EXPECT_NE(shown.output.find("world size      2, ZeRO stage 3"), std::string::npos) << shown.output;
  EXPECT_NE(shown.output.find("16 micro x 1 accumulation x 2 ranks"), std::string::npos) << shown.output;
  const Result verified = engine("checkpoint verify " + quoted(checkpoint));
  EXPECT_EQ(verified.status, 0) << verified.output;
  EXPECT_NE(verified.output.find("rank-00001.bin  OK"), std::string::npos) << verified.output;

  const fs::path out = scratch / "step-4.safetensors";
  const Result exported = engine("export " + quoted(checkpoint) + " " + quoted(out));
  ASSERT_EQ(exported.status, 0) << exported.output;
  expect_same_weights(out, run_dir / "model.safetensors");
}

}  // namespace
}  // namespace engine
