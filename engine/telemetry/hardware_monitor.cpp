#include "telemetry/hardware_monitor.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/whole_file.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The CPUs some thread of this process may run on. Not sched_getaffinity(0) alone: that is the
// calling thread's mask, which OpenMP narrows to one core when it binds its threads (OMP_PROC_BIND).
std::vector<int> allowed_cores() {
  cpu_set_t all;
  CPU_ZERO(&all);
  std::error_code error;
  for (const auto& task : fs::directory_iterator("/proc/self/task", error)) {
    const long tid = std::strtol(task.path().filename().c_str(), nullptr, 10);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (tid > 0 && sched_getaffinity(pid_t(tid), sizeof set, &set) == 0) CPU_OR(&all, &all, &set);
  }
  if (CPU_COUNT(&all) == 0 && sched_getaffinity(0, sizeof all, &all) != 0) return {};
  std::vector<int> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &all)) cores.push_back(cpu);
  return cores;
}

// The summed times of `cores` in one /proc/stat reading (total 0 when none is listed).
CpuTimes summed(const std::map<int, CpuTimes>& cpus, const std::vector<int>& cores) {
  CpuTimes sum;
  for (int core : cores)
    if (auto it = cpus.find(core); it != cpus.end()) {
      sum.busy += it->second.busy;
      sum.total += it->second.total;
    }
  return sum;
}

int64_t field_kib(const std::string& text, const std::string& key) {
  auto at = text.find(key + ":");
  if (at == std::string::npos) return -1;
  std::istringstream in(text.substr(at + key.size() + 1));
  int64_t kib = -1;
  in >> kib;
  return kib < 0 ? -1 : kib * 1024;
}

}  // namespace

std::map<int, CpuTimes> parse_proc_stat(const std::string& text) {
  std::map<int, CpuTimes> cpus;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || !std::isdigit(static_cast<unsigned char>(line[3]))) continue;
    std::istringstream in(line.substr(3));
    int cpu = -1;
    in >> cpu;
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    int64_t v[8] = {};
    for (int64_t& x : v) in >> x;
    if (!in) continue;
    const int64_t idle = v[3] + v[4];
    int64_t total = 0;
    for (int64_t x : v) total += x;
    cpus[cpu] = {total - idle, total};
  }
  return cpus;
}

int64_t parse_process_ticks(const std::string& text) {
  // The command name (field 2) may hold spaces and parentheses: fields restart after the last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream in(text.substr(close + 1));
  std::string field;
  int64_t utime = -1, stime = -1;
  for (int index = 3; in >> field; ++index) {
    if (index == 14) utime = std::stoll(field);
    if (index == 15) {
      stime = std::stoll(field);
      break;
    }
  }
  return utime < 0 || stime < 0 ? -1 : utime + stime;
}

double busy_percent(const CpuTimes& before, const CpuTimes& after) {
  const int64_t total = after.total - before.total;
  if (total <= 0) return 0;
  return 100.0 * double(after.busy - before.busy) / double(total);
}

NeighbourLoad::NeighbourLoad(std::string root)
    : root_(std::move(root)),
      cores_(allowed_cores()),
      start_(summed(parse_proc_stat(read("/proc/stat")), cores_)),
      start_ticks_(parse_process_ticks(read("/proc/self/stat"))) {}

std::string NeighbourLoad::read(const std::string& path) const { return read_whole_file(root_ + path).value_or(""); }

double NeighbourLoad::others_busy_percent() const {
  const CpuTimes now = summed(parse_proc_stat(read("/proc/stat")), cores_);
  const int64_t ticks = parse_process_ticks(read("/proc/self/stat"));
  const int64_t total = now.total - start_.total, cores = std::max<int64_t>(int64_t(cores_.size()), 1);
  // Under a tenth of a second per core, a tick or two of rounding is more than the share to tell.
  if (total < 10 * cores || ticks < 0 || start_ticks_ < 0) return -1;
  // /proc/stat and /proc/self/stat both count in USER_HZ ticks. This process may count a tick more
  // than the cores did (the files are read a moment apart); more than that, and they disagree.
  const int64_t others = (now.busy - start_.busy) - (ticks - start_ticks_);
  if (others < -2 * cores) return -1;
  return std::clamp(100.0 * double(others) / double(total), 0.0, 100.0);
}

HardwareMonitor::HardwareMonitor(double interval_seconds, std::string root, std::unique_ptr<GpuSensors> gpu)
    : interval_(interval_seconds), root_(std::move(root)), gpu_(std::move(gpu)), cores_(allowed_cores()) {
  sample();  // the baseline the first interval is measured against
  thread_ = std::thread([this] { loop(); });
}

HardwareMonitor::~HardwareMonitor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::string HardwareMonitor::read(const std::string& path) const { return read_whole_file(root_ + path).value_or(""); }

double HardwareMonitor::temperature() const {
  double hottest = -1;
  auto consider = [&](const fs::path& file) {
    std::ifstream in(file);
    double milli = 0;
    if (in >> milli && milli > 0 && milli < 200000) hottest = std::max(hottest, milli / 1000);
  };
  std::error_code error;
  for (const char* dir : {"/sys/class/thermal", "/sys/class/hwmon"}) {
    for (const auto& entry : fs::directory_iterator(root_ + dir, error)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("thermal_zone", 0) == 0) consider(entry.path() / "temp");
      if (name.rfind("hwmon", 0) == 0)
        for (const auto& sensor : fs::directory_iterator(entry.path(), error)) {
          const std::string file = sensor.path().filename().string();
          if (file.rfind("temp", 0) == 0 && file.size() > 6 && file.substr(file.size() - 6) == "_input")
            consider(sensor.path());
        }
    }
  }
  return hottest;
}

void HardwareMonitor::sample() {
  const double start = now_seconds();
  const std::map<int, CpuTimes> cpu = parse_proc_stat(read("/proc/stat"));
  const int64_t ticks = parse_process_ticks(read("/proc/self/stat"));
  const std::string status = read("/proc/self/status"), meminfo = read("/proc/meminfo");
  HardwareSample next;
  {
    std::lock_guard lock(mutex_);
    next.samples = latest_.samples + 1;
  }
  next.cores = cores_;
  if (!last_cpu_.empty()) {
    double sum = 0;
    for (int core : cores_) {
      const auto before = last_cpu_.find(core);
      const auto after = cpu.find(core);
      const double util =
          before == last_cpu_.end() || after == cpu.end() ? 0 : busy_percent(before->second, after->second);
      next.core_util.push_back(util);
      sum += util;
    }
    if (!cores_.empty()) next.cpu_util = sum / double(cores_.size());
    const double wall = start - last_time_;
    if (ticks >= 0 && last_process_ticks_ >= 0 && wall > 0 && !cores_.empty())
      next.process_cpu_util =
          100.0 * double(ticks - last_process_ticks_) / double(sysconf(_SC_CLK_TCK)) / wall / double(cores_.size());
  }
  next.rss_bytes = field_kib(status, "VmRSS");
  next.mem_available_bytes = field_kib(meminfo, "MemAvailable");
  next.temperature_c = temperature();
  if (gpu_) next.gpu = gpu_->read();
  last_cpu_ = cpu;
  last_process_ticks_ = ticks;
  last_time_ = start;
  std::lock_guard lock(mutex_);
  latest_ = std::move(next);
  seconds_sampling_ += now_seconds() - start;
}

void HardwareMonitor::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (wake_.wait_for(lock, std::chrono::duration<double>(interval_), [&] { return stop_; })) break;
    lock.unlock();
    sample();
    lock.lock();
  }
}

HardwareSample HardwareMonitor::latest() const {
  std::lock_guard lock(mutex_);
  return latest_;
}

double HardwareMonitor::seconds_sampling() const {
  std::lock_guard lock(mutex_);
  return seconds_sampling_;
}

}  // namespace engine
