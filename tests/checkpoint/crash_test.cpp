// Checkpoint durability, proved against the engine binary: whatever ends a run (kill -9 at any
// point of a checkpoint write, a full disk, a signal to one process or to an mpirun job) leaves
// only checkpoints whose every rank file matches its manifest's size and XXH3 checksum, and
// resuming from the latest one ends with the same model.safetensors, byte for byte, as a run that
// was never interrupted. Damaged checkpoints are refused by name; unfinished ones are ignored.
//
// The runs use the quick start shrunk to a few thousand parameters (a step takes about a
// millisecond), so a hundred kills and their resumes fit in well under a minute.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.h"
#include "checkpoint/checkpointer.h"
#include "checkpoint/durable_io.h"
#include "checkpoint/manifest.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Args = std::vector<std::string>;

constexpr int kExitUser = 2;
constexpr int kExitRequeue = 75;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A child process (the engine, or mpirun) with its output in a file. Exit statuses read as the
// shell does: the code, or 128 + the signal that ended it.
class Child {
 public:
  Child(const Args& argv, fs::path log, const std::vector<std::pair<std::string, std::string>>& env = {})
      : log_(std::move(log)) {
    pid_ = fork();
    if (pid_ == 0) {
      setenv("OMP_NUM_THREADS", "1", 1);
      for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> pointers;
      for (const std::string& a : argv) pointers.push_back(const_cast<char*>(a.c_str()));
      pointers.push_back(nullptr);
      execv(pointers[0], pointers.data());
      _exit(127);
    }
  }
  ~Child() {
    if (!status_) {
      kill(pid_, SIGKILL);
      int ignored;
      waitpid(pid_, &ignored, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  void signal(int number) const { kill(pid_, number); }
  // The status once the process has ended, without waiting.
  std::optional<int> poll() {
    if (status_) return status_;
    int raw = 0;
    if (waitpid(pid_, &raw, WNOHANG) == pid_) status_ = decode(raw);
    return status_;
  }
  // Waits up to `seconds`, then kills it (a hung run fails the test rather than the suite).
  int wait(double seconds = 240) {
    const auto begin = Clock::now();
    while (!poll()) {
      if (seconds_since(begin) > seconds) {
        kill(pid_, SIGKILL);
        int raw = 0;
        waitpid(pid_, &raw, 0);
        ADD_FAILURE() << "still running after " << seconds << " s:\n" << output();
        status_ = decode(raw);
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return *status_;
  }
  std::string output() const { return read_text(log_); }

 private:
  static int decode(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw); }
  fs::path log_;
  pid_t pid_ = -1;
  std::optional<int> status_;
};

// The quick start at a few thousand parameters, writing into `out`/run.
Args tiny_recipe(const fs::path& out, int steps, const Args& extra = {}) {
  Args args{ENGINE_BINARY,
            "train",
            SOURCE_DIR "/recipes/quickstart.yaml",
            "model.n_layer=1",
            "model.n_embd=16",
            "model.n_head=2",
            "model.context_length=16",
            "train.micro_batch_size=4",
            "train.eval_every=0",
            "train.log_every=1",
            "scheduler.warmup_steps=2",
            "run.name=run",
            "run.output_dir=" + out.string(),
            "train.steps=" + std::to_string(steps)};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// A model whose rank file (masters and two Adam moments, 5 MB) takes milliseconds to write and
// fsync, so kills land inside write() and fsync() rather than between checkpoints.
Args large_recipe(const fs::path& out, int steps, const Args& extra = {}) {
  Args args = tiny_recipe(out, steps, {"model.n_embd=192", "model.n_head=4", "train.micro_batch_size=1"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

Args mpirun(int ranks, const Args& engine_args) {
  Args args{MPIEXEC, "--allow-run-as-root", "--oversubscribe", MPIEXEC_NUMPROC_FLAG, std::to_string(ranks)};
  args.insert(args.end(), engine_args.begin(), engine_args.end());
  return args;
}

// Runs to completion; the exit status, with the output on failure.
int run(const Args& args, const fs::path& log, const std::vector<std::pair<std::string, std::string>>& env = {}) {
  Child child(args, log, env);
  return child.wait();
}

// model.safetensors of the run that was never interrupted (and wrote no checkpoints), once per
// command line (`make` builds it from an output directory).
std::string uninterrupted_model(const std::string& key, const std::function<Args(const fs::path&)>& make,
                                const std::vector<std::pair<std::string, std::string>>& env = {}) {
  static std::map<std::string, std::string> models;
  if (auto it = models.find(key); it != models.end()) return it->second;
  const engine::testing::TempDir dir("ckpt_reference");
  const int status = run(make(dir.path()), dir / "log", env);
  EXPECT_EQ(status, 0) << read_text(dir / "log");
  const std::string model = read_text(dir / "run" / "model.safetensors");
  EXPECT_FALSE(model.empty());
  return models[key] = model;
}

std::optional<int64_t> step_number(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

// Every committed checkpoint in `dir` (step-N with a manifest): the manifest parses, names step N,
// and every rank file has the size and XXH3 checksum it records. Returns their steps.
std::vector<int64_t> verify_committed(const fs::path& dir) {
  std::vector<int64_t> steps;
  for (const fs::path& checkpoint : engine::committed_checkpoints(dir)) {
    SCOPED_TRACE(checkpoint.string());
    engine::Manifest m;
    try {
      m = engine::read_manifest(checkpoint);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "committed checkpoint with an unreadable manifest: " << e.what();
      continue;
    }
    EXPECT_EQ(std::optional<int64_t>(m.step), step_number(checkpoint.filename().string(), "step-"));
    EXPECT_EQ(int(m.files.size()), m.world_size);
    for (const engine::CheckpointFile& f : m.files) {
      int64_t size = 0;
      const uint64_t sum = engine::read_file_chunks(
          checkpoint / f.name, [&](const std::byte*, size_t bytes, int64_t at) { size = at + int64_t(bytes); });
      EXPECT_EQ(size, f.bytes) << f.name;
      EXPECT_EQ(engine::checksum_hex(sum), f.xxh3) << f.name;
    }
    steps.push_back(m.step);
  }
  return steps;
}

bool has_unfinished_write(const fs::path& dir) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (entry.path().filename().string().rfind(".tmp-step-", 0) == 0) return true;
  return false;
}

// Kill -9 trials. Each trial starts `engine train` with a checkpoint after every step and
// checkpoint.resume: auto (so it continues from whatever the previous kill left), waits until it
// starts writing a checkpoint newer than the latest committed one, sleeps a random delay (10 us to
// 30 ms, log-uniform) and sends SIGKILL; then every committed checkpoint must verify. After every
// `group` - 1 kills, the next trial runs to the end undisturbed and must produce the uninterrupted
// run's model.safetensors exactly; then the chain starts again from nothing. Trials alternate
// checkpoint.async true and false.
struct KillStats {
  int kills = 0;         // processes ended by the SIGKILL
  int inside_write = 0;  // ... that left an unfinished .tmp-step directory behind
  int completions = 0;   // resumed runs compared against the uninterrupted one
};

using Recipe = std::function<Args(const fs::path&, int, const Args&)>;

void kill_trials(const std::string& name, const Recipe& recipe, int steps, int groups, int group, uint32_t seed,
                 KillStats& stats) {
  const std::string reference = uninterrupted_model(name + " " + std::to_string(steps),
                                                    [&](const fs::path& out) { return recipe(out, steps, {}); });
  std::mt19937 random(seed);
  std::uniform_real_distribution<double> log_delay(std::log(10e-6), std::log(30e-3));
  int trial = 0;
  for (int g = 0; g < groups; ++g) {
    const engine::testing::TempDir out("ckpt_kill");
    const fs::path checkpoints = out / "checkpoints";
    for (int i = 0; i < group; ++i, ++trial) {
      SCOPED_TRACE("trial " + std::to_string(trial));
      const bool async = trial % 2 == 0;
      const bool last = i + 1 == group;
      // The resumed run to the end writes no checkpoints: they change nothing, and cost an fsync a step.
      const Args args = recipe(out.path(), steps,
                               {std::string("checkpoint.every_steps=") + (last ? "0" : "1"), "checkpoint.keep_last=2",
                                "checkpoint.resume=auto", "checkpoint.dir=" + checkpoints.string(),
                                std::string("checkpoint.async=") + (async ? "true" : "false")});
      const std::vector<int64_t> before = verify_committed(checkpoints);
      const int64_t latest = before.empty() ? 0 : before.back();
      const auto launched = fs::file_time_type::clock::now();
      Child child(args, out / ("log-" + std::to_string(i)));
      if (last) {
        // Resume from what the kills left and train to the end.
        ASSERT_EQ(child.wait(), 0) << child.output();
        EXPECT_TRUE(read_text(out / "run" / "model.safetensors") == reference)
            << "model.safetensors differs from the uninterrupted run's after resuming from step " << latest;
        ++stats.completions;
        break;
      }
      // Wait for a checkpoint newer than `latest` being written by this process (a .tmp-step-N
      // left by an earlier kill is older than the launch; the engine removes it at start).
      const auto begin = Clock::now();
      bool writing = false;
      while (!writing && !child.poll() && seconds_since(begin) < 60) {
        std::error_code error;
        for (const auto& entry : fs::directory_iterator(checkpoints, error)) {
          const std::string entry_name = entry.path().filename().string();
          auto n = step_number(entry_name, "step-");
          if (!n) n = step_number(entry_name, ".tmp-step-");
          std::error_code time_error;
          if (n && *n > latest && fs::last_write_time(entry.path(), time_error) >= launched && !time_error) {
            writing = true;
            break;
          }
        }
        if (!writing) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (const auto status = child.poll()) {
        ASSERT_EQ(*status, 0) << child.output();  // it finished before the kill: a short chain
        break;
      }
      ASSERT_TRUE(writing) << "no checkpoint was started within 60 s:\n" << child.output();
      std::this_thread::sleep_for(std::chrono::duration<double>(std::exp(log_delay(random))));
      child.signal(SIGKILL);
      const int status = child.wait();
      if (status == 128 + SIGKILL) {
        ++stats.kills;
        if (has_unfinished_write(checkpoints)) ++stats.inside_write;
      } else {
        ASSERT_EQ(status, 0) << child.output();
      }
      const std::vector<int64_t> after = verify_committed(checkpoints);
      // A kill never loses a committed checkpoint that keep_last keeps.
      if (!before.empty()) {
        EXPECT_TRUE(!after.empty() && after.back() >= latest);
      }
    }
  }
  std::printf("%d kills (%d inside a write), %d resumed runs compared\n", stats.kills, stats.inside_write,
              stats.completions);
}

TEST(CheckpointCrash, KillNineWhileCheckpointingEveryStepLeavesOnlyVerifiableCheckpointsAndExactResumes) {
  KillStats stats;
  kill_trials("tiny", tiny_recipe, 100, 9, 10, 20261122, stats);
  EXPECT_GE(stats.kills, 75);  // a trial that finishes before its kill ends its chain early
  EXPECT_EQ(stats.completions, 9);
}

TEST(CheckpointCrash, KillNineInsideLargeRankFileWrites) {
  KillStats stats;
  kill_trials("large", large_recipe, 16, 3, 8, 7, stats);
  EXPECT_GE(stats.kills, 18);
  EXPECT_EQ(stats.completions, 3);
  // The point of the large model: some kills end the process inside a write.
  EXPECT_GT(stats.inside_write, 0);
}

}  // namespace

namespace {

// Bytes a checkpoint directory takes on tmpfs: every file in whole pages.
int64_t pages_bytes(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) total += (int64_t(entry.file_size()) + 4095) / 4096 * 4096;
  return total;
}

// A tmpfs mounted for the life of the object (skips the test where mounting is not allowed).
class SmallDisk {
 public:
  SmallDisk(const fs::path& where, int64_t bytes) : where_(where) {
    fs::create_directories(where_);
    const std::string options = "size=" + std::to_string(bytes / 1024) + "k";
    if (::mount("tmpfs", where_.c_str(), "tmpfs", 0, options.c_str()) != 0)
      error_ = std::string("cannot mount a tmpfs (") + std::strerror(errno) + "); the test needs root";
  }
  ~SmallDisk() {
    if (error_.empty()) ::umount2(where_.c_str(), MNT_DETACH);
  }
  const std::string& error() const { return error_; }

 private:
  fs::path where_;
  std::string error_;
};

// A disk with room for one checkpoint and a half: step 5's checkpoint is committed, step 10's
// cannot be written. on_error: stop ends the run with status 2 naming the file and the reason;
// continue warns and trains to the end. Either way step 5's checkpoint verifies, nothing
// unfinished is left, and a run resumed from it ends with the uninterrupted run's weights.
void full_disk(const std::string& on_error) {
  const engine::testing::TempDir out("ckpt_disk");
  const Args checkpoint_every_5{"checkpoint.every_steps=5"};
  // The size of one checkpoint, measured where the disk is large.
  ASSERT_EQ(run(tiny_recipe(out / "measure", 20, {"checkpoint.every_steps=5", "--stop-after", "5"}), out / "log"), 0)
      << read_text(out / "log");
  const int64_t one = pages_bytes(out / "measure" / "run" / "checkpoints" / "step-5");
  const fs::path disk = out / "disk";
  const SmallDisk mounted(disk, (one * 3 / 2 + 4095) / 4096 * 4096);
  if (!mounted.error().empty()) GTEST_SKIP() << mounted.error();
  const std::string reference =
      uninterrupted_model("tiny 20", [](const fs::path& dir) { return tiny_recipe(dir, 20); });

  const Args args =
      tiny_recipe(out.path(), 20,
                  {"checkpoint.every_steps=5", "checkpoint.dir=" + disk.string(), "checkpoint.on_error=" + on_error});
  Child child(args, out / "log");
  const int status = child.wait();
  const std::string output = child.output();
  if (on_error == "stop") {
    EXPECT_EQ(status, kExitUser) << output;
    EXPECT_NE(output.find(disk.string() + "/.tmp-step-10/"), std::string::npos) << output;
  } else {
    EXPECT_EQ(status, 0) << output;
    EXPECT_NE(output.find("training continues (checkpoint.on_error: continue)"), std::string::npos) << output;
  }
  EXPECT_NE(output.find("No space left on device"), std::string::npos) << output;
  EXPECT_NE(output.find("the previous checkpoint " + (disk / "step-5").string() + " is intact"), std::string::npos)
      << output;
  EXPECT_EQ(verify_committed(disk), std::vector<int64_t>{5});
  EXPECT_FALSE(has_unfinished_write(disk));

  // Step 5's checkpoint is whole: resuming from it (the disk still full) reproduces the weights.
  fs::remove(out / "run" / "model.safetensors");
  const Args resume = tiny_recipe(out.path(), 20, {"checkpoint.dir=" + disk.string(), "--resume", "latest"});
  Child resumed(resume, out / "log-resume");
  ASSERT_EQ(resumed.wait(), 0) << resumed.output();
  EXPECT_NE(resumed.output().find("resuming from " + (disk / "step-5").string()), std::string::npos)
      << resumed.output();
  EXPECT_TRUE(read_text(out / "run" / "model.safetensors") == reference);
}

TEST(CheckpointCrash, FullDiskWithOnErrorStopEndsNamingTheFileAndKeepsThePreviousCheckpoint) { full_disk("stop"); }

TEST(CheckpointCrash, FullDiskWithOnErrorContinueTrainsToTheEndAndKeepsThePreviousCheckpoint) { full_disk("continue"); }

// Checkpoints at steps 5 and 10 of a 20-step run, written with --stop-after 10.
struct SlicedRun {
  engine::testing::TempDir out{"ckpt_corrupt"};
  fs::path checkpoints = out / "run" / "checkpoints";
  SlicedRun() {
    const int status =
        run(tiny_recipe(out.path(), 20, {"checkpoint.every_steps=5", "--stop-after", "10"}), out / "log");
    EXPECT_EQ(status, 0) << read_text(out / "log");
    EXPECT_EQ(verify_committed(checkpoints), (std::vector<int64_t>{5, 10}));
  }
  // `--resume` (the latest complete checkpoint): the status and the output.
  std::pair<int, std::string> resume() const {
    Child child(tiny_recipe(out.path(), 20, {"--resume"}), out / "log-resume");
    const int status = child.wait();
    return {status, child.output()};
  }
};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(CheckpointCrash, AFlippedByteInARankFileIsRefusedNamingTheFileAndTheChecksum) {
  const SlicedRun r;
  const fs::path file = r.checkpoints / "step-10" / "rank-00000.bin";
  std::string bytes = read_text(file);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] ^= 0x10;
  write_bytes(file, bytes);
  const auto [status, output] = r.resume();
  EXPECT_EQ(status, kExitUser) << output;
  EXPECT_NE(output.find(file.string()), std::string::npos) << output;
  EXPECT_NE(output.find("checksum"), std::string::npos) << output;
}

TEST(CheckpointCrash, ATruncatedRankFileIsRefusedNamingTheFileAndItsSize) {
  const SlicedRun r;
  const fs::path file = r.checkpoints / "step-10" / "rank-00000.bin";
  const std::string bytes = read_text(file);
  fs::resize_file(file, bytes.size() - 1000);
  const auto [status, output] = r.resume();
  EXPECT_EQ(status, kExitUser) << output;
  EXPECT_NE(output.find(file.string() + " is " + std::to_string(bytes.size() - 1000) + " bytes, the manifest says " +
                        std::to_string(bytes.size())),
            std::string::npos)
      << output;
}

// A later step directory without manifest.json (a write cut off, however it got its name) is
// not a checkpoint: --resume takes the latest complete one and the run ends as if never cut.
TEST(CheckpointCrash, AStepDirectoryWithoutManifestIsIgnoredByResume) {
  const SlicedRun r;
  fs::create_directories(r.checkpoints / "step-15");
  fs::copy_file(r.checkpoints / "step-10" / "rank-00000.bin", r.checkpoints / "step-15" / "rank-00000.bin");
  const auto [status, output] = r.resume();
  ASSERT_EQ(status, 0) << output;
  EXPECT_NE(output.find("resuming from " + (r.checkpoints / "step-10").string() + " (step 10"), std::string::npos)
      << output;
  EXPECT_TRUE(read_text(r.out / "run" / "model.safetensors") ==
              uninterrupted_model("tiny 20", [](const fs::path& dir) { return tiny_recipe(dir, 20); }));
}

}  // namespace

namespace {

// Lines in metrics.jsonl (one per step with train.log_every=1).
int64_t logged_steps(const fs::path& metrics) {
  const std::string text = read_text(metrics);
  return std::count(text.begin(), text.end(), '\n');
}

// How a preemption test launches the engine and what it expects of the launcher.
struct Launch {
  std::string name;
  std::function<Args(const Args&)> wrap;  // the engine's command line, under mpirun or as it is
  std::vector<std::pair<std::string, std::string>> env;
  int steps;
  int log_every;
  double delivery;  // seconds from the signal to the launcher until the engine has it
  int status;       // the launcher's exit status
  int signal = SIGTERM;
};

// SIGTERM once training is under way: the run finishes its step, commits a checkpoint within
// checkpoint.preemption_budget of the signal, records "preempted" and exits 75; resuming from
// that checkpoint ends with the uninterrupted run's weights, byte for byte.
void preempt_and_resume(const Launch& launch) {
  constexpr double kBudget = 10;
  const auto recipe = [&](const fs::path& out, const Args& extra) {
    Args args{"train.log_every=" + std::to_string(launch.log_every)};
    args.insert(args.end(), extra.begin(), extra.end());
    return launch.wrap(tiny_recipe(out, launch.steps, args));
  };
  const std::string reference = uninterrupted_model(
      launch.name + " " + std::to_string(launch.steps), [&](const fs::path& dir) { return recipe(dir, {}); },
      launch.env);
  const engine::testing::TempDir out("ckpt_preempt");
  const fs::path checkpoints = out / "run" / "checkpoints";
  Child child(recipe(out.path(), {"checkpoint.preemption_budget=10"}), out / "log", launch.env);
  const auto launched = Clock::now();
  // Under way once a step beyond the first is logged (metrics.jsonl logs the first step too).
  while (logged_steps(out / "run" / "metrics.jsonl") < 2 && !child.poll() && seconds_since(launched) < 120)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_FALSE(child.poll()) << "the run ended before the signal:\n" << child.output();
  child.signal(launch.signal);
  const auto signalled = Clock::now();
  std::optional<double> committed_after;
  while (!child.poll() && seconds_since(signalled) < 120) {
    if (!committed_after && !engine::committed_checkpoints(checkpoints).empty())
      committed_after = seconds_since(signalled);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int status = child.wait();
  if (!committed_after && !engine::committed_checkpoints(checkpoints).empty())
    committed_after = seconds_since(signalled);
  const std::string output = child.output();
  EXPECT_EQ(status, launch.status) << output;
  EXPECT_NE(output.find("(exit status 75: requeue)"), std::string::npos) << output;
  ASSERT_TRUE(committed_after.has_value()) << output;
  EXPECT_LE(*committed_after, launch.delivery + kBudget) << output;
  std::printf("checkpoint committed %.3f s after the signal\n", *committed_after);
  const std::vector<int64_t> steps = verify_committed(checkpoints);
  ASSERT_EQ(steps.size(), 1u) << output;
  EXPECT_GT(steps[0], 0);
  EXPECT_LT(steps[0], launch.steps) << "the signal landed after the run: " << output;
  const auto summary = nlohmann::json::parse(read_text(out / "run" / "summary.json"));
  EXPECT_EQ(summary.at("preempted"), true);
  EXPECT_EQ(summary.at("steps"), steps[0]);
  EXPECT_FALSE(fs::exists(out / "run" / "model.safetensors"));

  Child resumed(recipe(out.path(), {"--resume", "latest"}), out / "log-resume", launch.env);
  ASSERT_EQ(resumed.wait(), 0) << resumed.output();
  EXPECT_TRUE(read_text(out / "run" / "model.safetensors") == reference)
      << "model.safetensors differs from the uninterrupted run's after resuming from step " << steps[0];
}

TEST(CheckpointCrash, SigtermCheckpointsWithinTheBudgetExits75AndResumesExactly) {
  preempt_and_resume({"tiny", [](const Args& a) { return a; }, {}, 1000, 1, 0, kExitRequeue});
}

// Open MPI 4.1's mpirun, on SIGTERM, stops relaying the ranks' output at once, passes SIGTERM to
// the ranks only odls_base_sigkill_timeout seconds later and SIGKILLs them as long again after
// that (measured: 2 s and 4 s with a timeout of 2); it then exits with status 1 whatever the ranks
// returned (75 here, which the engine prints). So the ranks must not fill the output buffer that
// nobody reads meanwhile (a progress line every step blocks rank 0 in write() until the SIGKILL):
// the run logs every 100 steps. A timeout of 2 s (a job would use 30) keeps the test short; the
// budget is measured from the signal to mpirun, plus that delay.
TEST(CheckpointCrash, SigtermToMpirunCheckpointsWithinTheBudgetAndResumesExactly) {
  std::vector<std::pair<std::string, std::string>> env{{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                       {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                                       {"OMPI_MCA_odls_base_sigkill_timeout", "2"}};
  preempt_and_resume({"mpirun 2", [](const Args& a) { return mpirun(2, a); }, env, 2000, 100, 2, 1});
}

// SIGUSR1 is forwarded to the ranks at once and kills nothing: mpirun returns the ranks' 75 (after
// waiting twice odls_base_sigkill_timeout for ranks that ended non-zero), the status a requeueing
// batch script looks for.
TEST(CheckpointCrash, SigusrOneToMpirunCheckpointsExits75AndResumesExactly) {
  std::vector<std::pair<std::string, std::string>> env{{"OMPI_ALLOW_RUN_AS_ROOT", "1"},
                                                       {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
                                                       {"OMPI_MCA_odls_base_sigkill_timeout", "1"}};
  preempt_and_resume(
      {"mpirun 2", [](const Args& a) { return mpirun(2, a); }, env, 1000, 100, 0, kExitRequeue, SIGUSR1});
}

// A second signal ends the process at once, status 75, in the middle of whatever the first one
// started (finishing the step, writing the preemption checkpoint of the large model, committing
// it): every committed checkpoint verifies and nothing half-written is taken for one.
TEST(CheckpointCrash, ASecondSignalExitsAt75AtOnceLeavingNoDamagedCheckpoint) {
  for (const std::string async : {"true", "false"}) {
    for (const int gap_ms : {1, 5, 20, 60, -1}) {
      SCOPED_TRACE("checkpoint.async=" + async + ", second signal " +
                   (gap_ms < 0 ? "once summary.json is written" : std::to_string(gap_ms) + " ms after the first"));
      const engine::testing::TempDir out("ckpt_second");
      const fs::path checkpoints = out / "run" / "checkpoints";
      Child child(large_recipe(out.path(), 400, {"checkpoint.every_steps=2", "checkpoint.async=" + async}),
                  out / "log");
      const auto launched = Clock::now();
      while (engine::committed_checkpoints(checkpoints).empty() && !child.poll() && seconds_since(launched) < 120)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ASSERT_FALSE(child.poll()) << child.output();
      child.signal(SIGTERM);
      if (gap_ms >= 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
      } else {
        // After the preemption's summary.json: the run is tearing down on its way to exit 75.
        const auto first = Clock::now();
        while (!fs::exists(out / "run" / "summary.json") && !child.poll() && seconds_since(first) < 60)
          std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      child.signal(SIGTERM);
      const auto second = Clock::now();
      const int status = child.wait();
      // The status proves the second signal was handled (the default action exits 128 + 15); the
      // time bound only guards against a hang, wide enough for a loaded machine.
      EXPECT_EQ(status, kExitRequeue) << child.output();
      EXPECT_LT(seconds_since(second), 60.0) << child.output();
      const std::vector<int64_t> steps = verify_committed(checkpoints);
      EXPECT_FALSE(steps.empty());
      // The run resumes from what it left: the latest committed checkpoint loads (checksums included).
      if (steps.empty()) continue;
      Child resumed(large_recipe(out.path(), 400, {"--resume", "--stop-after", std::to_string(steps.back() + 1)}),
                    out / "log-resume");
      EXPECT_EQ(resumed.wait(), 0) << resumed.output();
    }
  }
}

// ---- Offload's swap files (the NVMe tier) and the checkpoints beside them ----

// A swap directory that does not exist is made (as DeepSpeed makes its nvme_path); one that cannot
// be made (a file stands in its path) stops the run before its first step, naming it.
TEST(OffloadErrors, MissingSwapDirectoryIsMadeAndAnImpossibleOneNamed) {
  const engine::testing::TempDir out("offload-missing");
  const fs::path missing = out / "no-such-dir" / "swap";
  Child made(tiny_recipe(out.path(), 4, {"offload.optimizer=nvme", "offload.nvme_path=" + missing.string()}),
             out / "log");
  EXPECT_EQ(made.wait(), 0) << made.output();
  EXPECT_TRUE(fs::is_directory(missing));
  std::ofstream(out / "plain-file") << "x";
  const fs::path impossible = out / "plain-file" / "swap";
  Child child(tiny_recipe(out / "second", 4, {"offload.optimizer=nvme", "offload.nvme_path=" + impossible.string()}),
              out / "log2");
  EXPECT_EQ(child.wait(), kExitUser) << child.output();
  EXPECT_NE(child.output().find(impossible.string()), std::string::npos) << child.output();
  EXPECT_NE(child.output().find("cannot create the directory"), std::string::npos) << child.output();
  EXPECT_FALSE(fs::exists(out / "second" / "run" / "model.safetensors"));
}

// A swap disk without room for the swap file: a run resumed with offload onto it stops before
// training, naming the file and the sizes; the checkpoint it resumed from is untouched and resumes
// without offload to the end.
TEST(OffloadErrors, FullSwapDiskStopsBeforeTrainingAndLosesNoCheckpoint) {
  const engine::testing::TempDir out("offload-full");
  const SmallDisk disk(out / "swap", 16 * 1024);
  if (!disk.error().empty()) GTEST_SKIP() << disk.error();
  ASSERT_EQ(run(tiny_recipe(out.path(), 8, {"checkpoint.every_steps=4", "--stop-after", "4"}), out / "log"), 0)
      << read_text(out / "log");
  Child offloaded(tiny_recipe(out.path(), 8,
                              {"--resume", "offload.optimizer=nvme", "offload.nvme_path=" + (out / "swap").string()}),
                  out / "log-offload");
  EXPECT_EQ(offloaded.wait(), kExitUser) << offloaded.output();
  EXPECT_NE(offloaded.output().find((out / "swap").string()), std::string::npos) << offloaded.output();
  EXPECT_NE(offloaded.output().find("not enough space"), std::string::npos) << offloaded.output();
  EXPECT_EQ(verify_committed(out / "run" / "checkpoints"), std::vector<int64_t>{4});
  Child resumed(tiny_recipe(out.path(), 8, {"--resume"}), out / "log-resume");
  EXPECT_EQ(resumed.wait(), 0) << resumed.output();
}

// The swap file deleted under a running job (a scratch directory cleaned): the run stops at the
// next step with an error naming the file, and every checkpoint it committed verifies.
TEST(OffloadErrors, SwapFileDeletedMidRunStopsNamingItAndLosesNoCheckpoint) {
  const engine::testing::TempDir out("offload-deleted");
  fs::create_directories(out / "swap");
  const fs::path swap = out / "swap" / "run.rank-00000.optimizer.swap";
  Child child(tiny_recipe(out.path(), 100000,
                          {"checkpoint.every_steps=20", "offload.optimizer=nvme",
                           "offload.nvme_path=" + (out / "swap").string()}),
              out / "log");
  const fs::path checkpoints = out / "run" / "checkpoints";
  const auto launched = Clock::now();
  while (engine::committed_checkpoints(checkpoints).size() < 2 && !child.poll() && seconds_since(launched) < 120)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_FALSE(child.poll()) << child.output();
  ASSERT_TRUE(fs::exists(swap)) << child.output();
  fs::remove(swap);
  EXPECT_EQ(child.wait(), kExitUser) << child.output();
  EXPECT_NE(child.output().find(swap.string()), std::string::npos) << child.output();
  EXPECT_NE(child.output().find("deleted"), std::string::npos) << child.output();
  EXPECT_GE(verify_committed(checkpoints).size(), 2u);
  EXPECT_FALSE(has_unfinished_write(checkpoints));
}

}  // namespace
