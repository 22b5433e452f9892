// A job where one rank stops or dies must end, non-zero, within the timeout plus 10% of the
// collective's start, and the surviving rank's error must name the missing rank and the operation.
// Runs mpi_fault_driver under mpirun with a 2 s timeout and watches the clock from outside.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "../temp_dir.h"

namespace {

constexpr double kTimeout = 2.0;
constexpr double kBound = 1.1 * kTimeout;  // the promise: error (and job end) within timeout + 10%
constexpr double kTeardownSlack = 3.0;     // mpirun reaping the ranks after the abort
constexpr double kLaunchSlack = 20.0;      // starting mpirun and MPI on a loaded machine

struct Outcome {
  bool ended = false;  // false: mpirun still ran at the watchdog's limit and was killed
  int status = 0;
  double seconds = 0;         // mpirun's wall time
  long long ended_at_ms = 0;  // since the epoch
  std::string output;
};

Outcome run_job(const std::string& mode) {
  engine::testing::TempDir dir("mpi_fault");
  const std::string output = (dir / "output").string();
  const std::string timeout = std::to_string(kTimeout);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const char* argv[] = {MPIEXEC, "--allow-run-as-root", "--oversubscribe", MPIEXEC_NUMPROC_FLAG,
                          "2",     FAULT_DRIVER,          mode.c_str(),      timeout.c_str(),
                          nullptr};
    execv(MPIEXEC, const_cast<char* const*>(argv));
    _exit(127);
  }
  Outcome outcome;
  while (true) {
    if (waitpid(pid, &outcome.status, WNOHANG) == pid) {
      outcome.ended = true;
      break;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::duration<double>(kBound + kLaunchSlack + 30)) {
      kill(pid, SIGTERM);  // mpirun passes it on to the ranks
      std::this_thread::sleep_for(std::chrono::seconds(5));
      kill(pid, SIGKILL);
      waitpid(pid, &outcome.status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  outcome.ended_at_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::ifstream in(output);
  std::stringstream text;
  text << in.rdbuf();
  outcome.output = text.str();
  return outcome;
}

bool failed(const Outcome& o) { return WIFSIGNALED(o.status) || (WIFEXITED(o.status) && WEXITSTATUS(o.status) != 0); }

// Seconds from rank 0's "collective started at <ms>" line to mpirun's end.
double seconds_after_start(const Outcome& o) {
  size_t at = o.output.find("collective started at ");
  if (at == std::string::npos) return 1e9;
  long long started = std::stoll(o.output.substr(at + 22));
  return static_cast<double>(o.ended_at_ms - started) / 1000.0;
}

TEST(MpiFault, AHealthyJobCompletes) {
  Outcome o = run_job("none");
  ASSERT_TRUE(o.ended) << o.output;
  EXPECT_FALSE(failed(o)) << o.output;
  EXPECT_NE(o.output.find("rank 0 completed"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("rank 1 completed"), std::string::npos) << o.output;
}

TEST(MpiFault, AStoppedRankIsNamedAndTheJobEnds) {
  Outcome o = run_job("stop");
  ASSERT_TRUE(o.ended) << "mpirun was still running after " << o.seconds << " s: the stopped rank kept it alive\n"
                       << o.output;
  EXPECT_TRUE(failed(o)) << o.output;
  EXPECT_NE(o.output.find("rank 0: reduce-scatter of unit h.3's gradients (operation 2) did not complete within 2 s; "
                          "rank 1 did not reach it (stopped, hung or dead)"),
            std::string::npos)
      << o.output;
  size_t at = o.output.find("error after ");
  ASSERT_NE(at, std::string::npos) << o.output;
  double took = std::stod(o.output.substr(at + 12));
  EXPECT_GE(took, kTimeout);
  EXPECT_LE(took, kBound);
  EXPECT_LE(seconds_after_start(o), kBound + kTeardownSlack) << o.output;
  EXPECT_LE(o.seconds, kBound + kTeardownSlack + kLaunchSlack);
}

// In a process group the message names the group and the peers by their world rank (world rank 1
// is the group's rank 0 here).
TEST(MpiFault, AStoppedRankInAGroupIsNamedByWorldRankAndGroup) {
  Outcome o = run_job("group-stop");
  ASSERT_TRUE(o.ended) << o.output;
  EXPECT_TRUE(failed(o)) << o.output;
  EXPECT_NE(o.output.find("rank 0: reduce-scatter of unit h.3's gradients (operation 2 of its tensor-parallel "
                          "group) did not complete within 2 s; rank 1 did not reach it (stopped, hung or dead)"),
            std::string::npos)
      << o.output;
  EXPECT_LE(seconds_after_start(o), kBound + kTeardownSlack) << o.output;
}

TEST(MpiFault, AKilledRankEndsTheJob) {
  Outcome o = run_job("kill");
  ASSERT_TRUE(o.ended) << o.output;
  EXPECT_TRUE(failed(o)) << o.output;
  EXPECT_LE(seconds_after_start(o), kBound + kTeardownSlack) << o.output;
  EXPECT_LE(o.seconds, kBound + kTeardownSlack + kLaunchSlack);
}

}  // namespace
