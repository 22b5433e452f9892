// The memory limit from fake /proc and /sys trees (one per test, in a temporary directory), and the
// byte sizes engine plan's budgets are written in.
#include "core/memory_limit.h"

#include <gtest/gtest.h>

#include <fstream>

#include "temp_dir.h"

namespace engine {
namespace {

using testing::TempDir;

constexpr int64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024;

class FakeSystem {
 public:
  FakeSystem() : dir_("memory_limit") {}
  void write(const std::string& relative, const std::string& text) {
    const std::filesystem::path path = dir_.path() / relative;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  void meminfo(int64_t available_kib) {
    write("proc/meminfo", "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
                              std::to_string(available_kib) + " kB\nBuffers:          12345 kB\n");
  }
  void status(int64_t vm_size_kib, int64_t vm_data_kib) {
    write("proc/self/status", "Name:\tengine\nVmPeak:\t  999999 kB\nVmSize:\t  " + std::to_string(vm_size_kib) +
                                  " kB\nVmData:\t  " + std::to_string(vm_data_kib) + " kB\nVmStk:\t 132 kB\n");
  }
  const std::filesystem::path& root() const { return dir_.path(); }

 private:
  TempDir dir_;
};

TEST(MemoryLimit, MemAvailableAloneBinds) {
  FakeSystem sys;
  sys.meminfo(2 * 1024 * 1024);
  const MemoryLimit m = memory_limit(sys.root(), {});
  EXPECT_EQ(m.source, "MemAvailable");
  EXPECT_EQ(m.bytes, 2 * kGiB);
  EXPECT_NE(m.describe().find("MemAvailable: 2.0 GB left"), std::string::npos) << m.describe();
}

TEST(MemoryLimit, NothingReadableIsNoLimit) {
  FakeSystem sys;
  const MemoryLimit m = memory_limit(sys.root(), {});
  EXPECT_FALSE(m.known());
  EXPECT_EQ(m.bytes, kUnlimitedBytes);
}

TEST(MemoryLimit, CgroupV2MaxMinusCurrentOfTheTightestAncestor) {
  FakeSystem sys;
  sys.meminfo(8 * 1024 * 1024);
  sys.write("proc/self/cgroup", "0::/user.slice/job/step\n");
  sys.write("sys/fs/cgroup/user.slice/job/step/memory.max", "max\n");  // no limit of its own
  sys.write("sys/fs/cgroup/user.slice/job/step/memory.current", "100\n");
  sys.write("sys/fs/cgroup/user.slice/job/memory.max", std::to_string(3 * kGiB) + "\n");
  sys.write("sys/fs/cgroup/user.slice/job/memory.current", std::to_string(1 * kGiB) + "\n");
  sys.write("sys/fs/cgroup/user.slice/memory.max", std::to_string(16 * kGiB) + "\n");
  sys.write("sys/fs/cgroup/user.slice/memory.current", std::to_string(1 * kGiB) + "\n");
  const MemoryLimit m = memory_limit(sys.root(), {});
  EXPECT_EQ(m.bytes, 2 * kGiB);
  EXPECT_EQ(m.limit, 3 * kGiB);
  EXPECT_EQ(m.used, 1 * kGiB);
  EXPECT_EQ(m.source, "cgroup memory.max (" + (sys.root() / "sys/fs/cgroup/user.slice/job/memory.max").string() + ")");
}

TEST(MemoryLimit, CgroupV1WithAHostPathTheContainerDoesNotShow) {
  FakeSystem sys;
  sys.meminfo(8 * 1024 * 1024);
  // The container sees its own cgroup at the mount's root; /proc/self/cgroup names the host's path.
  sys.write("proc/self/cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n");
  sys.write("sys/fs/cgroup/memory/memory.limit_in_bytes", std::to_string(512 * kMiB) + "\n");
  sys.write("sys/fs/cgroup/memory/memory.usage_in_bytes", std::to_string(112 * kMiB) + "\n");
  const MemoryLimit m = memory_limit(sys.root(), {});
  EXPECT_EQ(m.bytes, 400 * kMiB);
  EXPECT_NE(m.source.find("cgroup memory.limit_in_bytes"), std::string::npos) << m.source;
}

TEST(MemoryLimit, CgroupV1NoLimitIsSkipped) {
  FakeSystem sys;
  sys.meminfo(1024 * 1024);
  sys.write("proc/self/cgroup", "4:memory:/\n");
  sys.write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  sys.write("sys/fs/cgroup/memory/memory.usage_in_bytes", "1000\n");
  EXPECT_EQ(memory_limit(sys.root(), {}).source, "MemAvailable");
}

TEST(MemoryLimit, AddressSpaceLimitCountsTheVirtualSizeAlreadyMapped) {
  FakeSystem sys;
  sys.meminfo(8 * 1024 * 1024);
  sys.status(300 * 1024, 50 * 1024);
  const MemoryLimit m = memory_limit(sys.root(), ResourceLimits{400 * kMiB, std::nullopt});
  EXPECT_EQ(m.source, "ulimit -v (RLIMIT_AS)");
  EXPECT_EQ(m.bytes, 100 * kMiB);
  EXPECT_EQ(m.limit, 400 * kMiB);
  EXPECT_EQ(m.used, 300 * kMiB);
  EXPECT_NE(m.describe().find("limit 400.0 MB, 300.0 MB in use"), std::string::npos) << m.describe();
}

TEST(MemoryLimit, DataLimitCountsVmData) {
  FakeSystem sys;
  sys.meminfo(8 * 1024 * 1024);
  sys.status(3000 * 1024, 50 * 1024);
  const MemoryLimit m = memory_limit(sys.root(), ResourceLimits{8 * kGiB, 250 * kMiB});
  EXPECT_EQ(m.source, "ulimit -d (RLIMIT_DATA)");
  EXPECT_EQ(m.bytes, 200 * kMiB);
}

TEST(MemoryLimit, EveryLimitIsListedAndTheSmallestBinds) {
  FakeSystem sys;
  sys.meminfo(1024 * 1024);  // 1 GiB
  sys.status(100 * 1024, 10 * 1024);
  sys.write("proc/self/cgroup", "0::/a\n");
  sys.write("sys/fs/cgroup/a/memory.max", std::to_string(2 * kGiB));
  sys.write("sys/fs/cgroup/a/memory.current", std::to_string(kGiB / 2));
  const ResourceLimits limits{4 * kGiB, 5 * kGiB};
  EXPECT_EQ(memory_limits(sys.root(), limits).size(), 4u);
  EXPECT_EQ(memory_limit(sys.root(), limits).source, "MemAvailable");
}

TEST(MemoryLimit, AnExhaustedLimitLeavesZero) {
  FakeSystem sys;
  sys.status(500 * 1024, 10 * 1024);
  EXPECT_EQ(memory_limit(sys.root(), ResourceLimits{400 * kMiB, std::nullopt}).bytes, 0);
}

TEST(MemoryLimit, MalformedFilesAreIgnored) {
  FakeSystem sys;
  sys.write("proc/meminfo", "MemAvailable: lots\n");
  sys.write("proc/self/cgroup", "garbage\n0::relative\n");
  sys.write("proc/self/status", "VmSize: 12 MB\n");
  const MemoryLimit m = memory_limit(sys.root(), ResourceLimits{400 * kMiB, std::nullopt});
  EXPECT_EQ(m.source, "ulimit -v (RLIMIT_AS)");  // VmSize unreadable: counted as 0 in use
  EXPECT_EQ(m.bytes, 400 * kMiB);
}

TEST(MemoryLimit, TheRealSystemHasMemAvailable) {
  const std::vector<MemoryLimit> limits = memory_limits("/", current_resource_limits());
  ASSERT_FALSE(limits.empty());
  EXPECT_EQ(limits.front().source, "MemAvailable");
  EXPECT_GT(limits.front().bytes, 0);
}

TEST(MemoryShortfall, TheHintNamesTheRecipeAndTheBudget) {
  const MemoryShortfall e("the plan needs 2 GB", 123456789);
  EXPECT_NE(std::string(e.what()).find("`engine plan RECIPE --fit --host-memory 123456789`"), std::string::npos);
  EXPECT_NE(
      e.with_recipe("r.yaml train.steps=2").find("`engine plan r.yaml train.steps=2 --fit --host-memory 123456789`"),
      std::string::npos);
}

TEST(ByteSize, UnitsAndPlainBytes) {
  EXPECT_EQ(parse_byte_size("123", "x"), 123);
  EXPECT_EQ(parse_byte_size("16GiB", "x"), 16 * kGiB);
  EXPECT_EQ(parse_byte_size("16gib", "x"), 16 * kGiB);
  EXPECT_EQ(parse_byte_size("512MiB", "x"), 512 * kMiB);
  EXPECT_EQ(parse_byte_size("400MB", "x"), 400'000'000);
  EXPECT_EQ(parse_byte_size("2G", "x"), 2 * kGiB);
  EXPECT_EQ(parse_byte_size("1.5GiB", "x"), 3 * kGiB / 2);
  EXPECT_EQ(parse_byte_size("4k", "x"), 4096);
  EXPECT_EQ(parse_byte_size("1TB", "x"), 1'000'000'000'000);
  EXPECT_EQ(parse_byte_size("64 MiB", "x"), 64 * kMiB);
  EXPECT_EQ(parse_byte_size("7B", "x"), 7);
}

TEST(ByteSize, MistakesNameTheFlag) {
  for (const char* bad : {"", "GiB", "12XB", "1.2.3G", "-5", "16 GiBs", "99999999999TB"}) {
    try {
      parse_byte_size(bad, "--host-memory");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("--host-memory"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace engine
