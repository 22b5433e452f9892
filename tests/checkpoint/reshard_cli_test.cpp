// Resharding through the command line: a checkpoint written by `mpirun -n 2 engine train` at ZeRO
// stage 3 (micro-batch 8 x accumulation 2 x 2 ranks = 32) continues with `engine train --resume` in
// one process at stage 0 (accumulation 4) and under `mpirun -n 4` at stage 2 (accumulation 1), and
// both end where the uninterrupted world-2 run ends, bit for bit: every rank sums the micro-batch
// gradients in the same global order, whatever the world. A refused recipe change exits with 2 and
// names the key with both values. Each rank runs one thread (oneDNN's rounding may depend on it).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>

#include "../temp_dir.h"
#include "resume_util.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string output;
};

// `engine train` on the tiny quick start in `dir`, by `world` ranks (1: no launcher).
Result engine_train(int world, const fs::path& dir, const std::string& arguments) {
  const std::string launcher = world == 1 ? std::string()
                                          : std::string(MPIEXEC) +
                                                " --allow-run-as-root --oversubscribe -x "
                                                "OMP_NUM_THREADS " MPIEXEC_NUMPROC_FLAG " " +
                                                std::to_string(world) + " ";
  std::string command =
      "OMP_NUM_THREADS=1 " + launcher + "'" ENGINE_BINARY "' train '" +
      (kSourceDir / "recipes/quickstart.yaml").string() + "' run.name=run run.output_dir='" + dir.string() +
      "' model.n_layer=1 model.n_embd=32 model.context_length=16 train.steps=" + std::to_string(kSteps) +
      " train.log_every=1 train.eval_every=4 train.eval_batches=2 " +
      "scheduler.warmup_steps=2 train.micro_batch_size=8 " + arguments + " 2>&1";
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) r.output.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = command + "\n" + r.output;
  return r;
}

TEST(ReshardCli, WorldTwoStageThreeContinuesAtWorldOneStageZeroAndWorldFourStageTwo) {
  const TempDir dir("reshard_cli");
  const std::string w2 = "distributed.zero_stage=3 train.gradient_accumulation_steps=2";
  const Result straight = engine_train(2, dir / "straight", w2);
  ASSERT_EQ(straight.status, 0) << straight.output;
  const Result cut = engine_train(2, dir / "cut", w2 + " --stop-after " + std::to_string(kCut));
  ASSERT_EQ(cut.status, 0) << cut.output;
  const Trajectory want = trajectory(dir / "straight" / "run");

  struct Target {
    int world;
    int stage;
    const char* note;
  };
  for (const Target t : {Target{1, 0, "gradient_accumulation_steps 2 -> 4 keeps the global batch of 32"},
                         Target{4, 2, "gradient_accumulation_steps 2 -> 1 keeps the global batch of 32"}}) {
    const std::string name = "w" + std::to_string(t.world);
    SCOPED_TRACE(name);
    fs::copy(dir / "cut", dir / name, fs::copy_options::recursive);
    // The recipe as the cut run had it (accumulation 2): resuming adjusts it to keep the batch.
    const Result resumed = engine_train(
        t.world, dir / name,
        "train.gradient_accumulation_steps=2 distributed.zero_stage=" + std::to_string(t.stage) + " --resume");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(t.note), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("resume: distributed.zero_stage: 3 -> " + std::to_string(t.stage)), std::string::npos)
        << resumed.output;
    expect_same_run(trajectory(dir / name / "run"), want, "world 2 stage 3 -> " + name);
  }

  // A wider model cannot take the checkpoint: exit status 2, the key and both values.
  fs::copy(dir / "cut", dir / "wider", fs::copy_options::recursive);
  const Result wider = engine_train(1, dir / "wider", "train.gradient_accumulation_steps=4 model.n_embd=64 --resume");
  EXPECT_EQ(wider.status, 2) << wider.output;
  EXPECT_NE(wider.output.find("model.n_embd: 32 -> 64"), std::string::npos) << wider.output;
}

}  // namespace
}  // namespace engine::testing
