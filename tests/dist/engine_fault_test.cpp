// A training job whose rank stops (SIGSTOP) or dies (SIGKILL) mid-step ends, non-zero, within
// distributed.timeout plus 10% (plus the launcher's teardown), and the surviving rank names the
// rank and the collective that did not complete; one that only one rank hears a stop signal from
// stops on every rank. The test starts `mpirun -n 2 engine train`, waits until steps are being
// logged, signals a rank and watches the clock.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "../temp_dir.h"

namespace {

constexpr double kTimeout = 3.0;
constexpr double kTeardownSlack = 3.0;  // mpirun reaping the ranks after the abort

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

struct Outcome {
  int status = 0;
  double seconds_after_signal = 0;
  std::string output;
};

Outcome signal_rank_mid_training(int rank, int signal_number) {
  const engine::testing::TempDir dir("engine_fault");
  const std::string pid_file = (dir / "rank.pid").string(), output = (dir / "output").string();
  // The rank records its pid and becomes the engine (exec keeps the pid).
  const std::string rank_script = "if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(rank) + " ]; then echo $$ > '" +
                                  pid_file +
                                  "'; fi; exec '" ENGINE_BINARY "' train " SOURCE_DIR
                                  "/recipes/golden/gpt_markov.yaml train.steps=100000 train.log_every=1 "
                                  "run.name=run distributed.timeout=" +
                                  std::to_string(kTimeout) + " run.output_dir='" + dir.path().string() + "'";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("OMP_NUM_THREADS", "1", 1);
    int fd = open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const char* argv[] = {
        MPIEXEC, "--allow-run-as-root", "--oversubscribe", MPIEXEC_NUMPROC_FLAG, "2", "sh", "-c", rank_script.c_str(),
        nullptr};
    execv(MPIEXEC, const_cast<char* const*>(argv));
    _exit(127);
  }
  Outcome outcome;
  const std::filesystem::path metrics = dir / "run" / "metrics.jsonl";
  const auto launched = std::chrono::steady_clock::now();
  // Training is under way once a few steps are logged.
  while (std::count(std::istreambuf_iterator<char>(*std::make_unique<std::ifstream>(metrics)),
                    std::istreambuf_iterator<char>(), '\n') < 3) {
    if (std::chrono::steady_clock::now() - launched > std::chrono::seconds(60)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const pid_t signalled_rank = std::stoi(read_file(pid_file));
  kill(signalled_rank, signal_number);
  const auto signalled = std::chrono::steady_clock::now();
  while (waitpid(pid, &outcome.status, WNOHANG) != pid) {
    if (std::chrono::steady_clock::now() - signalled > std::chrono::seconds(60)) {
      kill(signalled_rank, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &outcome.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  outcome.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  outcome.output = read_file(output);
  return outcome;
}

TEST(EngineFault, AStoppedRankEndsTheJobWithinTheTimeoutNamingItAndTheCollective) {
  const Outcome o = signal_rank_mid_training(1, SIGSTOP);
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.output;
  EXPECT_LT(o.seconds_after_signal, 1.1 * kTimeout + kTeardownSlack) << o.output;
  EXPECT_NE(o.output.find("rank 0:"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("did not complete within 3 s; rank 1 did not reach it"), std::string::npos) << o.output;
}

TEST(EngineFault, AKilledRankEndsTheJob) {
  const Outcome o = signal_rank_mid_training(1, SIGKILL);
  EXPECT_TRUE(WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0) << o.output;
  EXPECT_LT(o.seconds_after_signal, 1.1 * kTimeout + kTeardownSlack) << o.output;
}

// A stop signal that reaches one rank only stops every rank at the same step end (the ranks agree
// on it, trainer/step_decisions.h): the job checkpoints and exits 75 (requeue), whichever rank got
// it. Rank 0's own flags were once left out of the other ranks' agreement, so a signal to rank 0
// alone stopped rank 0 and left rank 1 waiting in the next step's collectives.
TEST(EngineFault, AStopSignalToOneRankStopsEveryRank) {
  for (int rank : {0, 1}) {
    const Outcome o = signal_rank_mid_training(rank, SIGTERM);
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
