// A training job whose rank stops (SIGSTOP) or dies (SIGKILL) mid-step ends, non-zero, within
// distributed.timeout plus 10% (plus the launcher's teardown), and the surviving rank names the
// rank and the collective that did not complete; one that only one rank hears a stop signal from
// stops on every rank. The test starts `mpirun -n 2 engine train`, waits until steps are being
// logged, signals a rank and watches the clock.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "../rank_signal.h"
#include "../temp_dir.h"

namespace {

using engine::testing::RankSignalOutcome;

constexpr double kTimeout = 3.0;
constexpr double kTeardownSlack = 3.0;  // mpirun reaping the ranks after the abort

RankSignalOutcome signal_rank_mid_training(int rank, int signal_number) {
  return engine::testing::signal_rank_mid_training(
      {MPIEXEC, ENGINE_BINARY, SOURCE_DIR "/recipes/golden/gpt_markov.yaml", "", kTimeout}, rank, signal_number);
}

TEST(EngineFault, AStoppedRankEndsTheJobWithinTheTimeoutNamingItAndTheCollective) {
  const RankSignalOutcome o = signal_rank_mid_training(1, SIGSTOP);
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.output;
  EXPECT_LT(o.seconds_after_signal, 1.1 * kTimeout + kTeardownSlack) << o.output;
  EXPECT_NE(o.output.find("rank 0:"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("did not complete within 3 s; rank 1 did not reach it"), std::string::npos) << o.output;
}

TEST(EngineFault, AKilledRankEndsTheJob) {
  const RankSignalOutcome o = signal_rank_mid_training(1, SIGKILL);
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.output;
  EXPECT_LT(o.seconds_after_signal, 1.1 * kTimeout + kTeardownSlack) << o.output;
}

// A stop signal that reaches one rank only stops every rank at the same step end (the ranks agree
// on it, trainer/step_decisions.h): the job checkpoints and exits 75 (requeue), whichever rank got
// it. Rank 0's own flags were once left out of the other ranks' agreement, so a signal to rank 0
// alone stopped rank 0 and left rank 1 waiting in the next step's collectives.
TEST(EngineFault, AStopSignalToOneRankStopsEveryRank) {
  for (int rank : {0, 1}) {
    const RankSignalOutcome o = signal_rank_mid_training(rank, SIGTERM);
    EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) == 75) << "rank " << rank << ":\n" << o.output;
    EXPECT_NE(o.output.find("preempted after step"), std::string::npos) << "rank " << rank << ":\n" << o.output;
  }
}

}  // namespace

namespace {

// Ranks given different recipes would issue different collectives: the job is refused at start.
TEST(EngineFault, RanksWithDifferentRecipesAreRefused) {
  const engine::testing::TempDir dir("engine_mismatch");
  const std::string command = std::string(MPIEXEC) +
                              " --allow-run-as-root --oversubscribe " MPIEXEC_NUMPROC_FLAG
                              " 2 sh -c 'exec \"" ENGINE_BINARY "\" train " SOURCE_DIR
                              "/recipes/golden/gpt_markov.yaml train.steps=2 run.output_dir=" +
                              dir.path().string() + " optimizer.lr=0.01$OMPI_COMM_WORLD_RANK' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("rank 1 runs a different recipe or engine build than rank 0"), std::string::npos) << output;
}

}  // namespace
