// signal_rank_mid_training: starts `mpirun -n 2 engine train ...`, waits until steps are being
// logged, sends one rank a signal and watches the clock until the job ends; for the tests of what a
// stopped, killed or preempted rank does to a job (tests/dist/engine_fault_test.cpp on CPU ranks,
// tests/cuda/cuda_zero_test.cpp on ranks sharing a GPU).
//
//   const RankSignalOutcome o = signal_rank_mid_training({MPIEXEC, ENGINE_BINARY, "recipes/x.yaml", "", 3.0},
//                                                        1, SIGSTOP);
//   EXPECT_LT(o.seconds_after_signal, 1.1 * 3.0 + 3.0) << o.output;
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "temp_dir.h"

namespace engine::testing {

struct RankSignalJob {
  std::string mpirun;     // the launcher's path (run with --allow-run-as-root --oversubscribe -n 2)
  std::string engine;     // the engine binary
  std::string recipe;     // the recipe's path
  std::string overrides;  // more key=value words for `engine train`
  double timeout = 3.0;   // distributed.timeout, seconds
};

struct RankSignalOutcome {
  int status = 0;  // waitpid's status of mpirun
  double seconds_after_signal = 0;
  std::string output;  // every rank's stdout and stderr
};

inline std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline RankSignalOutcome signal_rank_mid_training(const RankSignalJob& job, int rank, int signal_number) {
  const TempDir dir("rank_signal");
  const std::string pid_file = (dir / "rank.pid").string(), output = (dir / "output").string();
  // The rank records its pid and becomes the engine (exec keeps the pid).
  const std::string rank_script =
      "if [ \"$OMPI_COMM_WORLD_RANK\" = " + std::to_string(rank) + " ]; then echo $$ > '" + pid_file + "'; fi; exec '" +
      job.engine + "' train '" + job.recipe +
      "' train.steps=100000 train.log_every=1 run.name=run distributed.timeout=" + std::to_string(job.timeout) +
      " run.output_dir='" + dir.path().string() + "' " + job.overrides;
  pid_t pid = fork();
  if (pid == 0) {
    setenv("OMP_NUM_THREADS", "1", 1);
    int fd = open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    const char* argv[] = {job.mpirun.c_str(),
                          "--allow-run-as-root",
                          "--oversubscribe",
                          "-n",
                          "2",
                          "sh",
                          "-c",
                          rank_script.c_str(),
                          nullptr};
    execv(job.mpirun.c_str(), const_cast<char* const*>(argv));
    _exit(127);
  }
  RankSignalOutcome outcome;
  const std::filesystem::path metrics = dir / "run" / "metrics.jsonl";
  const auto launched = std::chrono::steady_clock::now();
  // Training is under way once a few steps are logged.
  while (std::count(std::istreambuf_iterator<char>(*std::make_unique<std::ifstream>(metrics)),
                    std::istreambuf_iterator<char>(), '\n') < 3) {
    if (std::chrono::steady_clock::now() - launched > std::chrono::seconds(60)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string pid_text = read_text_file(pid_file);
  const pid_t signalled_rank = pid_text.empty() ? pid : std::stoi(pid_text);
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
  outcome.output = read_text_file(output);
  return outcome;
}

}  // namespace engine::testing
