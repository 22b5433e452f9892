// HardwareMonitor: a background thread that samples the machine every `interval` seconds, so a
// run's metrics show what the hardware did while it trained. On CPU it reads /proc and /sys:
// utilisation of each core the process may run on, this process's CPU use and resident memory,
// the memory available, and the hottest readable temperature sensor; on a GPU run, the GPU's own
// sensors through NVML (telemetry/gpu_sensors.h). The step never waits for it: the trainer reads
// the latest sample when it logs (bench/monitor_overhead.sh measures the cost).
//
//   HardwareMonitor monitor(5.0);                 // starts sampling
//   HardwareSample now = monitor.latest();        // cpu_util, rss_bytes, ... (-1: not known yet)
//
// The parsers take file contents, and the monitor a root directory, so tests run on fake trees.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/gpu_sensors.h"

namespace engine {

struct HardwareSample {
  int64_t samples = 0;               // taken so far
  std::vector<int> cores;            // the CPUs this process's threads may run on
  std::vector<double> core_util;     // percent busy per core, over the last interval
  double cpu_util = -1;              // their mean, percent
  double process_cpu_util = -1;      // this process, percent of those cores
  int64_t rss_bytes = -1;            // resident memory of this process
  int64_t mem_available_bytes = -1;  // MemAvailable
  double temperature_c = -1;         // the hottest readable sensor; -1 where none is readable
  GpuReading gpu;                    // the GPU's sensors (every field -1 without them)
};

// Busy and total jiffies of one CPU line of /proc/stat.
struct CpuTimes {
  int64_t busy = 0, total = 0;
};
std::map<int, CpuTimes> parse_proc_stat(const std::string& text);  // by CPU number
// utime + stime of /proc/<pid>/stat, in clock ticks (-1 when unreadable).
int64_t parse_process_ticks(const std::string& text);
// Percent busy between two readings (0 when no time passed).
double busy_percent(const CpuTimes& before, const CpuTimes& after);

// The share of this process's cores that other processes (and, in a virtual machine, the
// hypervisor's steal) kept busy while a measurement ran. The probes (telemetry/peak_flops.h)
// record it beside their figure: a probe on a busy machine reads low.
//
//   NeighbourLoad load;          // starts counting
//   ... measure ...
//   double busy = load.others_busy_percent();
class NeighbourLoad {
 public:
  explicit NeighbourLoad(std::string root = "");  // `root` prefixes /proc (tests)
  // Percent of the cores' time since construction that was not idle and not this process's;
  // -1 when not known: /proc unreadable, under a tenth of a second per core, or readings that
  // disagree (this process busier than its cores).
  double others_busy_percent() const;

 private:
  std::string read(const std::string& path) const;
  const std::string root_;
  const std::vector<int> cores_;
  CpuTimes start_;
  int64_t start_ticks_ = -1;
};

class HardwareMonitor {
 public:
  // `root` prefixes /proc and /sys (tests); interval > 0; `gpu`: the sensors of the run's GPU.
  explicit HardwareMonitor(double interval_seconds, std::string root = "", std::unique_ptr<GpuSensors> gpu = nullptr);
  ~HardwareMonitor();
  HardwareMonitor(const HardwareMonitor&) = delete;
  HardwareMonitor& operator=(const HardwareMonitor&) = delete;

  HardwareSample latest() const;
  double seconds_sampling() const;  // the thread's own time spent sampling, in all
  // Takes a sample now, on the caller's thread (tests; the thread calls it every interval).
  void sample();

 private:
  void loop();
  std::string read(const std::string& path) const;
  double temperature() const;

  const double interval_;
  const std::string root_;
  const std::unique_ptr<GpuSensors> gpu_;
  std::vector<int> cores_;
  std::map<int, CpuTimes> last_cpu_;
  int64_t last_process_ticks_ = -1;
  double last_time_ = 0;
  mutable std::mutex mutex_;
  HardwareSample latest_;
  double seconds_sampling_ = 0;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace engine
