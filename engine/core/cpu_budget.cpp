#include "core/cpu_budget.h"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "core/whole_file.h"

namespace engine {

namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

// A whole decimal integer, or nullopt ("12x", "", overflow).
std::optional<long long> parse_integer(std::string_view text) {
  std::string s(trim(text));
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return std::nullopt;
  return value;
}

std::optional<double> quota_in_cores(long long quota, long long period) {
  if (quota <= 0 || period <= 0) return std::nullopt;
  return double(quota) / double(period);
}

// mountinfo writes space, tab, newline and backslash in paths as \ooo.
std::string unescape_mount_path(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size()) {
      std::string_view digits = text.substr(i + 1, 3);
      if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '7'; })) {
        out += char((digits[0] - '0') * 64 + (digits[1] - '0') * 8 + (digits[2] - '0'));
        i += 3;
        continue;
      }
    }
    out += text[i];
  }
  return out;
}

struct Mount {
  std::string root;   // the part of the cgroup tree this mount shows
  std::string point;  // where it is mounted
};

// The cgroup2 mount (controller empty) or the v1 mount that carries `controller`.
std::optional<Mount> find_cgroup_mount(std::string_view mountinfo, std::string_view controller) {
  for (std::string_view line : split(mountinfo, '\n')) {
    std::vector<std::string_view> fields = split(trim(line), ' ');
    auto dash = std::find(fields.begin(), fields.end(), "-");
    // "... root mount-point options [optional...] - type source super-options"
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    std::string_view type = dash[1], super_options = dash[3];
    bool match = controller.empty() ? type == "cgroup2" : false;
    if (!controller.empty() && type == "cgroup")
      for (std::string_view option : split(super_options, ','))
        if (option == controller) match = true;
    if (match) return Mount{unescape_mount_path(fields[3]), unescape_mount_path(fields[4])};
  }
  return std::nullopt;
}

// The directories from the process's cgroup up to the mount's root, innermost first.
std::vector<std::string> cgroup_directories(const Mount& mount, std::string path) {
  if (mount.root != "/" && path.rfind(mount.root, 0) == 0) path = path.substr(mount.root.size());
  std::vector<std::string> dirs;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dirs.push_back(mount.point + (path == "/" ? "" : path));
    if (path.empty() || path == "/") return dirs;
    size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

void keep_smaller(Quota& best, std::optional<double> cores, const std::string& source) {
  if (cores && (!best.cores || *cores < *best.cores)) best = Quota{cores, source};
}

}  // namespace

std::optional<double> parse_cpu_max(std::string_view text) {
  std::vector<std::string_view> fields = split(trim(text), ' ');
  if (fields.empty() || fields.size() > 2 || trim(fields[0]) == "max") return std::nullopt;
  std::optional<long long> quota = parse_integer(fields[0]);
  // The period is optional when written, and the kernel's default is 100 ms.
  std::optional<long long> period = fields.size() == 2 ? parse_integer(fields[1]) : 100000;
  if (!quota || !period) return std::nullopt;
  return quota_in_cores(*quota, *period);
}

std::optional<double> parse_cfs_quota(std::string_view quota_us, std::string_view period_us) {
  std::optional<long long> quota = parse_integer(quota_us), period = parse_integer(period_us);
  if (!quota || !period) return std::nullopt;
  return quota_in_cores(*quota, *period);
}

std::optional<int> parse_slurm_tasks_per_node(std::string_view text, std::optional<int> node) {
  // Entries are "N" or "N(xM)" (M consecutive nodes with N tasks each).
  int largest = 0, first_node = 0;
  for (std::string_view entry : split(trim(text), ',')) {
    size_t paren = entry.find('(');
    std::optional<long long> tasks = parse_integer(entry.substr(0, paren));
    long long repeat = 1;
    if (paren != std::string_view::npos) {
      std::string_view rest = entry.substr(paren);
      if (rest.size() < 4 || rest.substr(0, 2) != "(x" || rest.back() != ')') return std::nullopt;
      std::optional<long long> r = parse_integer(rest.substr(2, rest.size() - 3));
      if (!r || *r < 1) return std::nullopt;
      repeat = *r;
    }
    if (!tasks || *tasks < 1 || *tasks > (1 << 20)) return std::nullopt;
    if (node && *node >= first_node && *node < first_node + repeat) return int(*tasks);
    largest = std::max(largest, int(*tasks));
    first_node += int(std::min<long long>(repeat, 1 << 20));
  }
  return largest > 0 ? std::optional<int>(largest) : std::nullopt;
}

Counted local_ranks_from_environment(const GetEnv& getenv) {
  auto counted = [](const char* name, const char* value, std::optional<long long> n) -> std::optional<Counted> {
    if (!n || *n < 1 || *n > (1 << 20)) return std::nullopt;  // malformed: try the next launcher's variable
    return Counted{int(*n), std::string(name) + "=" + value};
  };
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* value = getenv(name))
      if (auto c = counted(name, value, parse_integer(value))) return *c;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"}) {
    const char* value = getenv(name);
    if (!value) continue;
    std::optional<int> node;
    if (const char* id = getenv("SLURM_NODEID"))
      if (auto n = parse_integer(id)) node = int(std::clamp<long long>(*n, 0, 1 << 20));
    if (auto tasks = parse_slurm_tasks_per_node(value, node))
      if (auto c = counted(name, value, *tasks)) return *c;
  }
  return Counted{};
}

Quota cgroup_quota(const ReadFile& read) {
  Quota best;
  std::optional<std::string> membership = read("/proc/self/cgroup");
  std::optional<std::string> mountinfo = read("/proc/self/mountinfo");
  if (!membership || !mountinfo) return best;
  for (std::string_view line : split(*membership, '\n')) {
    // "0::/user.slice/x" (v2) or "4:cpu,cpuacct:/docker/x" (v1).
    size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string_view::npos || second == std::string_view::npos) continue;
    std::string_view controllers = line.substr(first + 1, second - first - 1);
    std::string path(trim(line.substr(second + 1)));
    if (path.empty() || path[0] != '/') continue;
    if (line.substr(0, first) == "0" && controllers.empty()) {
      if (auto mount = find_cgroup_mount(*mountinfo, ""))
        for (const std::string& dir : cgroup_directories(*mount, path))
          if (auto text = read(dir + "/cpu.max")) keep_smaller(best, parse_cpu_max(*text), "cgroup v2 " + dir);
      continue;
    }
    std::vector<std::string_view> names = split(controllers, ',');
    if (std::find(names.begin(), names.end(), "cpu") == names.end()) continue;
    if (auto mount = find_cgroup_mount(*mountinfo, "cpu"))
      for (const std::string& dir : cgroup_directories(*mount, path)) {
        auto quota = read(dir + "/cpu.cfs_quota_us"), period = read(dir + "/cpu.cfs_period_us");
        if (quota && period) keep_smaller(best, parse_cfs_quota(*quota, *period), "cgroup v1 " + dir);
      }
  }
  return best;
}

CpuBudget cpu_budget(const CpuFacts& facts) {
  CpuBudget budget;
  budget.facts = facts;
  int cores = std::max(1, facts.affinity);
  if (facts.quota) cores = std::min(cores, std::max(1, int(std::min(std::ceil(*facts.quota - 1e-9), 1e6))));
  budget.cores = cores;
  budget.threads = std::max(1, cores / std::max(1, facts.local_ranks.value));
  return budget;
}

std::string CpuBudget::describe() const {
  auto plural = [](int n, const char* one, const char* many) {
    return std::to_string(n) + " " + (n == 1 ? one : many);
  };
  std::ostringstream out;
  out << plural(threads, "thread", "threads") << " (affinity " << plural(facts.affinity, "core", "cores")
      << ", cgroup ";
  if (facts.quota)
    out << "quota " << facts.quota.value() << " cores";
  else
    out << "unlimited";
  out << ", " << plural(facts.local_ranks.value, "rank", "ranks") << " on this machine";
  if (!facts.local_ranks.source.empty()) out << " from " << facts.local_ranks.source;
  out << ")";
  return out.str();
}

CpuFacts read_cpu_facts() {
  CpuFacts facts;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    facts.affinity = std::max(1, CPU_COUNT(&set));
  else  // more CPUs than a cpu_set_t holds
    facts.affinity = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  Quota quota = cgroup_quota([](const std::string& path) { return read_whole_file(path); });
  facts.quota = quota.cores;
  facts.quota_source = quota.source;
  facts.local_ranks = local_ranks_from_environment([](const char* name) { return std::getenv(name); });
  return facts;
}

// The user's OMP_NUM_THREADS when set and not empty (libgomp has read it, and it stands), else null.
static const char* users_thread_count() {
  const char* given = std::getenv("OMP_NUM_THREADS");
  return given && *given ? given : nullptr;
}

int planned_openmp_threads() {
  return users_thread_count() ? omp_get_max_threads() : cpu_budget(read_cpu_facts()).threads;
}

ThreadChoice apply_cpu_budget() {
  if (const char* given = users_thread_count())
    return ThreadChoice{omp_get_max_threads(),
                        std::to_string(omp_get_max_threads()) + " threads (OMP_NUM_THREADS=" + given + ")"};
  CpuBudget budget = cpu_budget(read_cpu_facts());
  omp_set_num_threads(budget.threads);
  return ThreadChoice{budget.threads, budget.describe()};
}

}  // namespace engine
