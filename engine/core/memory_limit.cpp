#include "core/memory_limit.h"
#include "core/format.h"
#include "core/whole_file.h"

#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace engine {

namespace fs = std::filesystem;

namespace {

// cgroup v1 writes "no limit" as the largest page-aligned int64; anything this large is no limit.
constexpr int64_t kNoLimitAbove = int64_t(1) << 62;

// The first whitespace-delimited token of `text` as a non-negative integer ("max" and junk: nullopt).
std::optional<int64_t> leading_integer(const std::string& text) {
  std::istringstream in(text);
  std::string token;
  if (!(in >> token) || token.empty() || !std::all_of(token.begin(), token.end(), ::isdigit)) return std::nullopt;
  errno = 0;
  const long long value = std::strtoll(token.c_str(), nullptr, 10);
  if (errno != 0) return std::nullopt;
  return int64_t(value);
}

// "VmSize:     3896 kB" in /proc/self/status, /proc/meminfo's "MemAvailable: 2330 kB": bytes.
std::optional<int64_t> kilobytes_field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    long long kilobytes = 0;
    std::string unit;
    if (!(fields >> kilobytes >> unit) || unit != "kB" || kilobytes < 0) return std::nullopt;
    return int64_t(kilobytes) * 1024;
  }
  return std::nullopt;
}

// The cgroup directory of `path` under `mount` and each of its ancestors up to the mount, innermost
// first. Inside a container /proc/self/cgroup may name the host's path, which this mount does not
// show: its missing directories are skipped and the mount's root (the container's cgroup) remains.
std::vector<fs::path> cgroup_directories(const fs::path& mount, std::string path) {
  std::vector<fs::path> dirs;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    dirs.push_back(path == "/" || path.empty() ? mount : mount / path.substr(1));
    if (path.empty() || path == "/") return dirs;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

// The tightest limit - usage over the directories (`limit_file` and `usage_file` in each).
void add_cgroup_limit(std::vector<MemoryLimit>& out, const fs::path& mount, const std::string& path,
                      const char* limit_file, const char* usage_file) {
  std::optional<MemoryLimit> best;
  for (const fs::path& dir : cgroup_directories(mount, path)) {
    auto limit_text = read_whole_file(dir / limit_file), usage_text = read_whole_file(dir / usage_file);
    if (!limit_text || !usage_text) continue;
    auto limit = leading_integer(*limit_text), usage = leading_integer(*usage_text);
    if (!limit || !usage || *limit >= kNoLimitAbove) continue;
    MemoryLimit m{std::max<int64_t>(0, *limit - *usage),
                  std::string("cgroup ") + limit_file + " (" + (dir / limit_file).string() + ")", *limit, *usage};
    if (!best || m.bytes < best->bytes) best = m;
  }
  if (best) out.push_back(*best);
}

void add_rlimit(std::vector<MemoryLimit>& out, std::optional<int64_t> limit, std::optional<int64_t> used,
                const char* source) {
  if (!limit || *limit >= kNoLimitAbove) return;
  const int64_t in_use = used.value_or(0);
  out.push_back({std::max<int64_t>(0, *limit - in_use), source, *limit, in_use});
}

}  // namespace

std::string MemoryLimit::describe() const {
  if (!known()) return "no memory limit found";
  std::string text = source + ": " + format_bytes(bytes) + " left";
  if (limit > 0) text += " (limit " + format_bytes(limit) + ", " + format_bytes(used) + " in use)";
  return text;
}

ResourceLimits current_resource_limits() {
  ResourceLimits limits;
  auto read = [](int resource) -> std::optional<int64_t> {
    rlimit r{};
    if (::getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return std::nullopt;
    return int64_t(std::min<rlim_t>(r.rlim_cur, rlim_t(kUnlimitedBytes)));
  };
  limits.address_space = read(RLIMIT_AS);
  limits.data = read(RLIMIT_DATA);
  return limits;
}

std::vector<MemoryLimit> memory_limits(const fs::path& root, const ResourceLimits& limits) {
  std::vector<MemoryLimit> out;
  if (auto meminfo = read_whole_file(root / "proc/meminfo"))
    if (auto available = kilobytes_field(*meminfo, "MemAvailable")) out.push_back({*available, "MemAvailable", 0, 0});

  if (auto membership = read_whole_file(root / "proc/self/cgroup")) {
    std::istringstream lines(*membership);
    std::string line;
    while (std::getline(lines, line)) {
      // "0::/user.slice/x" (v2) or "4:memory:/docker/x" (v1).
      const size_t first = line.find(':'), second = line.find(':', first + 1);
      if (first == std::string::npos || second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
      if (path.empty() || path[0] != '/') continue;
      if (line.substr(0, first) == "0" && controllers.empty()) {
        // The unified hierarchy: mounted at /sys/fs/cgroup, or at /sys/fs/cgroup/unified beside v1.
        for (const char* mount : {"sys/fs/cgroup", "sys/fs/cgroup/unified"})
          add_cgroup_limit(out, root / mount, path, "memory.max", "memory.current");
        continue;
      }
      std::istringstream names(controllers);
      std::string name;
      while (std::getline(names, name, ','))
        if (name == "memory")
          add_cgroup_limit(out, root / "sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes");
    }
  }

  const std::optional<std::string> status = read_whole_file(root / "proc/self/status");
  auto field = [&](const char* key) { return status ? kilobytes_field(*status, key) : std::nullopt; };
  add_rlimit(out, limits.address_space, field("VmSize"), "ulimit -v (RLIMIT_AS)");
  add_rlimit(out, limits.data, field("VmData"), "ulimit -d (RLIMIT_DATA)");
  return out;
}

MemoryLimit memory_limit(const fs::path& root, const ResourceLimits& limits) {
  MemoryLimit smallest;
  for (const MemoryLimit& m : memory_limits(root, limits))
    if (!smallest.known() || m.bytes < smallest.bytes) smallest = m;
  return smallest;
}

MemoryLimit memory_limit() { return memory_limit("/", current_resource_limits()); }

namespace {

const char* kHintRecipe = "RECIPE";

std::string hint(const std::string& recipe, int64_t budget) {
  return "; `engine plan " + recipe + " --fit --host-memory " + std::to_string(budget) +
         "` finds a ZeRO stage, offload, activation checkpointing and micro-batch that fit in " + format_bytes(budget);
}

}  // namespace

MemoryShortfall::MemoryShortfall(std::string message, int64_t budget)
    : UserError(message + hint(kHintRecipe, budget)), message_(std::move(message)), budget_(budget) {}

std::string MemoryShortfall::with_recipe(const std::string& recipe_and_overrides) const {
  return message_ + hint(recipe_and_overrides, budget_);
}

std::string out_of_memory_message(const std::string& recipe_and_overrides) {
  const MemoryLimit limit = memory_limit();
  return "out of memory: an allocation failed (std::bad_alloc); the limit in force is " + limit.describe() +
         "; reduce the model or the micro-batch, or raise the limit" +
         (limit.known() ? hint(recipe_and_overrides, limit.bytes) : "");
}

int64_t parse_byte_size(const std::string& text, const std::string& what) {
  auto fail = [&]() -> int64_t {
    throw UserError(what + " " + (text.empty() ? "''" : text) +
                    ": not a size; write bytes (4294967296) or a number with a unit: 512MiB, 16GiB, 400MB, 2G");
  };
  size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  if (end == 0 || std::count(text.begin(), text.begin() + long(end), '.') > 1) return fail();
  const double number = std::strtod(text.substr(0, end).c_str(), nullptr);
  std::string unit = text.substr(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  std::string lower;
  for (char c : unit) lower += char(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  const char* prefixes = "kmgt";
  if (lower.empty() || lower == "b") {
    scale = 1;
  } else if (const char* p = std::strchr(prefixes, lower[0]); p && *p) {
    const int power = int(p - prefixes) + 1;
    const std::string rest = lower.substr(1);
    if (rest.empty() || rest == "ib")
      scale = std::pow(1024.0, power);
    else if (rest == "b")
      scale = std::pow(1000.0, power);
  }
  if (scale == 0) return fail();
  const double bytes = std::round(number * scale);
  if (!(bytes >= 0) || bytes >= 9.2e18) return fail();
  return int64_t(bytes);
}

}  // namespace engine
