// The hardware monitor: its /proc parsers on known text, a sample of a fake /proc and /sys tree
// with exact expected values, and the real thread (samples at its interval, stops at once).
#include "telemetry/hardware_monitor.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/cpu_budget.h"
#include "scoped_env.h"
#include "telemetry/peak_flops.h"
#include "temp_dir.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

cpu_set_t allowed_set() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return set;
}

// A fake /proc/stat in which every core this process may use has spent `busy` and `idle` jiffies.
void write_proc_stat(const fs::path& root, int64_t busy, int64_t idle) {
  const cpu_set_t set = allowed_set();
  std::string text = "cpu  0 0 0 0 0 0 0 0\n";
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set))
      text += "cpu" + std::to_string(cpu) + " " + std::to_string(busy) + " 0 0 " + std::to_string(idle) + " 0 0 0 0\n";
  write(root / "proc/stat", text);
}

// Other processes, one spinning on each core this process may use, until destroyed.
class SpinningNeighbours {
 public:
  SpinningNeighbours() {
    const cpu_set_t set = allowed_set();
    for (int i = 0; i < CPU_COUNT(&set); ++i) {
      const pid_t child = fork();
      if (child == 0) {
        // Never outlive the test: killed with it, and in any case after a minute.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        alarm(60);
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
      }
      if (child > 0) children_.push_back(child);
    }
  }
  ~SpinningNeighbours() {
    for (pid_t child : children_) kill(child, SIGKILL);
    for (pid_t child : children_) waitpid(child, nullptr, 0);
  }
  SpinningNeighbours(const SpinningNeighbours&) = delete;
  SpinningNeighbours& operator=(const SpinningNeighbours&) = delete;

 private:
  std::vector<pid_t> children_;
};

TEST(HardwareMonitor, ParsesProcStatPerCpu) {
  const auto cpus = parse_proc_stat(
      "cpu  100 0 50 800 50 0 0 0 0 0\n"
      "cpu0 10 1 2 100 3 4 5 6 0 0\n"
      "cpu1 0 0 0 10 0 0 0 0 0 0\n"
      "intr 12345\n");
  ASSERT_EQ(cpus.size(), 2u);  // the aggregate line is not a CPU
  EXPECT_EQ(cpus.at(0).total, 10 + 1 + 2 + 100 + 3 + 4 + 5 + 6);
  EXPECT_EQ(cpus.at(0).busy, 10 + 1 + 2 + 4 + 5 + 6);  // idle and iowait are not busy
  EXPECT_EQ(cpus.at(1).busy, 0);
  EXPECT_DOUBLE_EQ(busy_percent({0, 100}, {30, 200}), 30.0);
  EXPECT_DOUBLE_EQ(busy_percent({5, 100}, {5, 100}), 0.0);
}

TEST(HardwareMonitor, ProcessTicksSurviveACommandNameWithSpacesAndParentheses) {
  // Fields 14 and 15 (utime, stime) counted after the last ')'.
  EXPECT_EQ(parse_process_ticks("42 (my (odd) name) R 1 2 3 4 5 6 7 8 9 10 700 300 0 0 20 0 1"), 1000);
  EXPECT_EQ(parse_process_ticks("garbage"), -1);
}

TEST(HardwareMonitor, SamplesAFakeMachineExactly) {
  TempDir root("monitor");
  const cpu_set_t set = allowed_set();
  auto stat = [&](int64_t busy, int64_t idle) { write_proc_stat(root.path(), busy, idle); };
  stat(100, 100);
  write(root / "proc/self/stat", "1 (engine) R 1 2 3 4 5 6 7 8 9 10 100 0 0 0");
  write(root / "proc/self/status", "Name: engine\nVmRSS:\t  2048 kB\n");
  write(root / "proc/meminfo", "MemTotal: 100 kB\nMemAvailable:   4096 kB\n");
  write(root / "sys/class/thermal/thermal_zone0/temp", "45000\n");
  write(root / "sys/class/hwmon/hwmon1/temp2_input", "51500\n");
  write(root / "sys/class/hwmon/hwmon1/temp2_label", "Tctl\n");

  HardwareMonitor monitor(3600, root.path().string());  // the thread waits; the test samples
  HardwareSample first = monitor.latest();
  EXPECT_EQ(first.samples, 1);
  EXPECT_EQ(first.cpu_util, -1);  // one reading: no interval to measure yet
  EXPECT_EQ(first.rss_bytes, 2048 * 1024);
  EXPECT_EQ(first.mem_available_bytes, 4096 * 1024);
  EXPECT_DOUBLE_EQ(first.temperature_c, 51.5);  // the hottest sensor

  stat(100 + 75, 100 + 25);  // 75 of 100 jiffies busy on every core
  monitor.sample();
  HardwareSample second = monitor.latest();
  EXPECT_EQ(second.samples, 2);
  ASSERT_EQ(second.core_util.size(), size_t(CPU_COUNT(&set)));
  for (double util : second.core_util) EXPECT_DOUBLE_EQ(util, 75.0);
  EXPECT_DOUBLE_EQ(second.cpu_util, 75.0);
  EXPECT_GE(second.process_cpu_util, 0.0);
}

TEST(HardwareMonitor, RealThreadSamplesAtItsIntervalAndStopsAtOnce) {
  {
    HardwareMonitor monitor(0.01);
    // Five samples at 10 ms take 50 ms; a loaded machine may take longer, so wait for them (up to
    // a minute) rather than for a fixed time.
    const auto began = std::chrono::steady_clock::now();
    while (monitor.latest().samples < 5 && std::chrono::steady_clock::now() - began < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const HardwareSample sample = monitor.latest();
    EXPECT_GE(sample.samples, 5);
    EXPECT_GE(sample.cpu_util, 0.0);
    EXPECT_LE(sample.cpu_util, 100.0);
    EXPECT_GT(sample.rss_bytes, 0);
    EXPECT_GT(sample.mem_available_bytes, 0);
  }
  const auto start = std::chrono::steady_clock::now();
  { HardwareMonitor idle(3600); }  // must not wait out its interval (an hour; a minute is a hang guard)
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0);
}

// Spinning children take every core only where no cgroup quota holds the process and its children
// to fewer cores than its affinity allows.
bool children_can_fill_the_cores() {
  const CpuFacts facts = read_cpu_facts();
  return !facts.quota || *facts.quota >= double(facts.affinity) - 0.01;
}

TEST(NeighbourLoad, IsTheCoresBusyTimeLessThisProcesssOwnOnAFakeMachine) {
  TempDir root("neighbours");
  const cpu_set_t set = allowed_set();
  const auto cores = int64_t(CPU_COUNT(&set));
  write_proc_stat(root.path(), 100, 100);
  write(root / "proc/self/stat", "1 (engine) R 1 2 3 4 5 6 7 8 9 10 100 0 0 0");
  const NeighbourLoad load(root.path().string());
  // Each core: 100 more jiffies, 75 of them busy; this process used 25 of them on each.
  write_proc_stat(root.path(), 100 + 75, 100 + 25);
  write(root / "proc/self/stat", "1 (engine) R 1 2 3 4 5 6 7 8 9 10 " + std::to_string(100 + 20 * cores) + " " +
                                     std::to_string(5 * cores) + " 0 0");
  EXPECT_DOUBLE_EQ(load.others_busy_percent(), 50.0);
  // This process counted a tick more than the cores' busy time (the files are read a moment
  // apart): no neighbours. Many more, and the readings disagree: not known.
  write(root / "proc/self/stat",
        "1 (engine) R 1 2 3 4 5 6 7 8 9 10 " + std::to_string(100 + 75 * cores + 1) + " 0 0 0");
  EXPECT_DOUBLE_EQ(load.others_busy_percent(), 0.0);
  write(root / "proc/self/stat", "1 (engine) R 1 2 3 4 5 6 7 8 9 10 " + std::to_string(100 + 90 * cores) + " 0 0 0");
  EXPECT_EQ(load.others_busy_percent(), -1);
  // Under a tenth of a second per core: too short to tell.
  write_proc_stat(root.path(), 100 + 5, 100 + 4);
  EXPECT_EQ(load.others_busy_percent(), -1);
  EXPECT_EQ(NeighbourLoad((root / "nowhere").string()).others_busy_percent(), -1);
}

TEST(NeighbourLoad, SeesAProcessSpinningOnEveryCore) {
  if (!children_can_fill_the_cores()) GTEST_SKIP() << "a cgroup CPU quota holds this process below its cores";
  const NeighbourLoad readable;
  double busy = -1;
  {
    SpinningNeighbours neighbours;
    const NeighbourLoad load;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    busy = load.others_busy_percent();
  }
  EXPECT_GT(busy, 50.0);  // this process slept: the cores were the children's (and any other test's)
  EXPECT_GE(readable.others_busy_percent(), 0.0);
}

// OpenMP binding (OMP_PROC_BIND) narrows each thread's mask to one core; the cores the monitor and
// the neighbour load count are those of all the process's threads, not the calling thread's.
TEST(NeighbourLoad, CountsTheCoresOfEveryThreadNotOnlyTheCallers) {
  const cpu_set_t all = allowed_set();
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "one core: nothing to narrow";
  std::mutex mutex;
  std::condition_variable done;
  bool finished = false;
  std::thread other([&] {  // keeps the whole mask while this thread narrows its own
    std::unique_lock lock(mutex);
    done.wait(lock, [&] { return finished; });
  });
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &all)) {
      CPU_SET(cpu, &one);
      break;
    }
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const size_t counted = HardwareMonitor(3600).latest().cores.size();
  EXPECT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  {
    std::lock_guard lock(mutex);
    finished = true;
  }
  done.notify_all();
  other.join();
  EXPECT_EQ(counted, size_t(CPU_COUNT(&all)));
}

// The probe records how busy the rest of the machine was; a busy probe says so every time it is
// used, from the cache too.
TEST(PeakFlops, AProbeTakenWhileOtherProcessesHoldTheCoresSaysSoWhereverItIsUsed) {
  if (!children_can_fill_the_cores()) GTEST_SKIP() << "a cgroup CPU quota holds this process below its cores";
  TempDir cache("busy_peak_cache");
  const testing::ScopedEnv cache_home("XDG_CACHE_HOME", cache.path().string());
  PeakFlops busy;
  {
    SpinningNeighbours neighbours;
    busy = peak_flops(DType::f32, 1);
  }
  EXPECT_EQ(busy.source, "measured");
  EXPECT_GT(busy.neighbours_busy_percent, 40.0);
  const std::string note = busy_probe_note(busy.neighbours_busy_percent);
  EXPECT_NE(note.find("probed while other processes kept"), std::string::npos) << note;
  const PeakFlops cached = peak_flops(DType::f32, 1);
  EXPECT_EQ(cached.source, "cached in " + (cache / "engine/peak_flops.json").string());
  EXPECT_EQ(cached.neighbours_busy_percent, busy.neighbours_busy_percent);
  EXPECT_EQ(busy_probe_note(kBusyNeighboursPercent - 1), "");
  EXPECT_EQ(busy_probe_note(-1), "");  // not known: nothing to say
}

TEST(PeakFlops, ForgettingDropsOnlyThatEntryAndOlderBareNumberCachesStillRead) {
  TempDir cache("forget_peak_cache");
  const testing::ScopedEnv cache_home("XDG_CACHE_HOME", cache.path().string());
  const fs::path file = cache / "engine/peak_flops.json";
  const MemoryBandwidth bandwidth = memory_bandwidth(1);
  const PeakFlops peak = peak_flops(DType::f32, 1);
  EXPECT_EQ(peak.source, "measured");
  EXPECT_FALSE(forget_cached_peak(DType::f32, 1, peak.flops_per_second / 2));  // another run's figure: kept
  EXPECT_TRUE(forget_cached_peak(DType::f32, 1, peak.flops_per_second));
  EXPECT_FALSE(forget_cached_peak(DType::f32, 1, peak.flops_per_second));  // already gone
  EXPECT_EQ(memory_bandwidth(1).source, "cached in " + file.string());
  EXPECT_EQ(peak_flops(DType::f32, 1).source, "measured");
  // An older engine's cache holds bare numbers: read as figures whose neighbours are not known.
  nlohmann::json entries;
  std::ifstream(file) >> entries;
  for (auto& [key, entry] : entries.items()) {
    ASSERT_TRUE(entry.is_object()) << key;
    entry = entry.at("per_second");
  }
  std::ofstream(file) << entries.dump();
  const PeakFlops old = peak_flops(DType::f32, 1);
  EXPECT_EQ(old.source, "cached in " + file.string());
  EXPECT_EQ(old.neighbours_busy_percent, -1);
  EXPECT_EQ(memory_bandwidth(1).bytes_per_second, bandwidth.bytes_per_second);
}

TEST(PeakFlops, MeasuredOnceThenReadFromTheCacheAndReprobedWhenTheCacheIsUnreadable) {
  TempDir cache("peak_cache");
  const testing::ScopedEnv cache_home("XDG_CACHE_HOME", cache.path().string());
  const fs::path file = cache / "engine/peak_flops.json";
  ASSERT_EQ(peak_cache_file(), file);
  const PeakFlops first = peak_flops(DType::f32, 1);
  EXPECT_EQ(first.source, "measured");
  EXPECT_GT(first.flops_per_second, 1e8);  // any CPU that runs the engine
  ASSERT_TRUE(fs::exists(file));
  const PeakFlops second = peak_flops(DType::f32, 1);
  EXPECT_EQ(second.source, "cached in " + file.string());
  EXPECT_EQ(second.flops_per_second, first.flops_per_second);
  EXPECT_EQ(peak_flops(DType::f32, 2).source, "measured");  // another thread count is another key
  std::ofstream(file) << "{ not json";
  EXPECT_EQ(peak_flops(DType::f32, 1).source, "measured");
  EXPECT_EQ(peak_flops(DType::f32, 1).source, "cached in " + file.string());
}

}  // namespace
}  // namespace engine
