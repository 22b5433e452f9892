// The memory limit: how many more bytes this process may allocate before something refuses.
//
// Four limits can bind, and the smallest one wins:
//   - MemAvailable (/proc/meminfo): what the kernel can hand out without swapping;
//   - the cgroup's memory limit: cgroup v2 memory.max minus memory.current, v1 memory.limit_in_bytes
//     minus memory.usage_in_bytes, of the process's cgroup and each of its ancestors;
//   - ulimit -v (RLIMIT_AS) minus the process's VmSize: it counts virtual memory, mapped or not;
//   - ulimit -d (RLIMIT_DATA) minus VmData (heap and private anonymous mappings).
// A run whose plan does not fit in it is refused before training (check_memory_available), and an
// allocation that still fails names it (main.cpp).
//
// The reader takes the file-system root and the resource limits as arguments, so tests point it at
// a directory of fake /proc and /sys files:
//
//   MemoryLimit limit = memory_limit();  // the real system
//   if (needed > limit.bytes) throw UserError("... " + limit.source + " leaves " + ...);
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"

namespace engine {

inline constexpr int64_t kUnlimitedBytes = std::numeric_limits<int64_t>::max();

struct MemoryLimit {
  int64_t bytes = kUnlimitedBytes;  // what is left under this limit
  // "MemAvailable", "cgroup memory.max (/sys/fs/cgroup/x)", "ulimit -v (RLIMIT_AS)", ...; empty when
  // no limit was found.
  std::string source;
  int64_t limit = 0, used = 0;  // the limit and what counts against it (0, 0 for MemAvailable)

  bool known() const { return !source.empty(); }
  // "ulimit -v (RLIMIT_AS): 120.0 MB left (limit 390.6 MB, 270.6 MB in use)"
  std::string describe() const;
};

// The process's resource limits in bytes; nullopt: unlimited.
struct ResourceLimits {
  std::optional<int64_t> address_space;  // RLIMIT_AS
  std::optional<int64_t> data;           // RLIMIT_DATA
};
ResourceLimits current_resource_limits();  // getrlimit

// Every limit found under `root` (root/proc/meminfo, root/proc/self/{cgroup,status},
// root/sys/fs/cgroup/...) and in `limits`, in the order above; files that are missing or malformed
// are skipped (a limit we cannot read must not stop training).
std::vector<MemoryLimit> memory_limits(const std::filesystem::path& root, const ResourceLimits& limits);
// The smallest of them (source empty when there is none).
MemoryLimit memory_limit(const std::filesystem::path& root, const ResourceLimits& limits);
MemoryLimit memory_limit();  // "/" and getrlimit

// A plan that needs more memory than the limit leaves. The message ends with a hint to run
// `engine plan <recipe> --fit --host-memory <budget>`; the command line that knows the recipe fills
// it in with with_recipe().
class MemoryShortfall : public UserError {
 public:
  MemoryShortfall(std::string message, int64_t budget);
  int64_t budget() const { return budget_; }
  // The same message with `recipe_and_overrides` in the hint.
  std::string with_recipe(const std::string& recipe_and_overrides) const;

 private:
  std::string message_;
  int64_t budget_;
};

// The message for an allocation that failed (std::bad_alloc) although the plan fitted, or before
// there was one: a user error, naming the limit in force now and the command that finds a fitting
// configuration (`recipe_and_overrides`, or RECIPE when unknown).
std::string out_of_memory_message(const std::string& recipe_and_overrides = "RECIPE");

// Parses a byte size: "16GiB", "400MB", "512MiB", "1.5G", "123" (bytes); k/M/G/T alone and
// KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000. Throws UserError naming `what`.
int64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace engine
