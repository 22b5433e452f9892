// The CPU budget's arithmetic and parsing, from injected inputs (no real cgroup or launcher).
#include "core/cpu_budget.h"

#include "core/openmp_wait.h"

#include <gtest/gtest.h>

#include <map>

namespace engine {
namespace {

CpuFacts facts(int affinity, std::optional<double> quota, int local_ranks) {
  CpuFacts f;
  f.affinity = affinity;
  f.quota = quota;
  f.local_ranks =
      Counted{local_ranks, local_ranks == 1 ? "" : "OMPI_COMM_WORLD_LOCAL_SIZE=" + std::to_string(local_ranks)};
  return f;
}

TEST(CpuBudget, AffinityAloneGivesOneThreadPerCore) {
  EXPECT_EQ(cpu_budget(facts(8, std::nullopt, 1)).threads, 8);
  EXPECT_EQ(cpu_budget(facts(1, std::nullopt, 1)).threads, 1);
}

TEST(CpuBudget, QuotaIsRoundedUpAndCapsTheAffinity) {
  EXPECT_EQ(cpu_budget(facts(8, 1.5, 1)).threads, 2);
  EXPECT_EQ(cpu_budget(facts(8, 2.0, 1)).threads, 2);  // exactly two cores is not three
  EXPECT_EQ(cpu_budget(facts(8, 0.2, 1)).threads, 1);
  EXPECT_EQ(cpu_budget(facts(2, 16.0, 1)).threads, 2);  // a quota above the mask changes nothing
}

TEST(CpuBudget, LocalRanksShareTheCoresAtLeastOneEach) {
  EXPECT_EQ(cpu_budget(facts(2, std::nullopt, 2)).threads, 1);
  EXPECT_EQ(cpu_budget(facts(16, std::nullopt, 4)).threads, 4);
  EXPECT_EQ(cpu_budget(facts(16, 6.0, 4)).threads, 1);  // 6 cores over 4 ranks: one each, not two
  EXPECT_EQ(cpu_budget(facts(2, std::nullopt, 8)).threads, 1);
  EXPECT_EQ(cpu_budget(facts(10, std::nullopt, 3)).threads, 3);
}

TEST(CpuBudget, DescribeNamesEveryInput) {
  EXPECT_EQ(cpu_budget(facts(2, std::nullopt, 1)).describe(),
            "2 threads (affinity 2 cores, cgroup unlimited, 1 rank on this machine)");
  EXPECT_EQ(cpu_budget(facts(8, 1.5, 2)).describe(),
            "1 thread (affinity 8 cores, cgroup quota 1.5 cores, 2 ranks on this machine from "
            "OMPI_COMM_WORLD_LOCAL_SIZE=2)");
}

TEST(CpuBudget, CgroupV2CpuMax) {
  EXPECT_EQ(parse_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(parse_cpu_max("max"), std::nullopt);
  EXPECT_DOUBLE_EQ(parse_cpu_max("150000 100000\n").value(), 1.5);
  EXPECT_DOUBLE_EQ(parse_cpu_max("400000 100000").value(), 4.0);
  EXPECT_DOUBLE_EQ(parse_cpu_max("50000").value(), 0.5);  // the period defaults to 100 ms
  for (const char* bad : {"", "abc 100000", "150000 0", "-5 100000", "1 2 3", "150000 100000x"})
    EXPECT_EQ(parse_cpu_max(bad), std::nullopt) << bad;
}

TEST(CpuBudget, CgroupV1CfsQuota) {
  EXPECT_EQ(parse_cfs_quota("-1\n", "100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(parse_cfs_quota("250000\n", "100000\n").value(), 2.5);
  EXPECT_EQ(parse_cfs_quota("junk", "100000"), std::nullopt);
}

GetEnv environment(std::map<std::string, std::string> vars) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    auto it = shared->find(name);
    return it == shared->end() ? nullptr : it->second.c_str();
  };
}

TEST(CpuBudget, LocalRanksFromTheLauncher) {
  EXPECT_EQ(local_ranks_from_environment(environment({})).value, 1);
  EXPECT_EQ(local_ranks_from_environment(environment({})).source, "");
  Counted ompi = local_ranks_from_environment(environment({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(ompi.value, 2);
  EXPECT_EQ(ompi.source, "OMPI_COMM_WORLD_LOCAL_SIZE=2");
  EXPECT_EQ(local_ranks_from_environment(environment({{"MPI_LOCALNRANKS", "3"}})).value, 3);
  EXPECT_EQ(local_ranks_from_environment(environment({{"SLURM_NTASKS_PER_NODE", "4"}})).value, 4);
  // Slurm's step list: node 3 is the first of the "(x2)" pair.
  EXPECT_EQ(
      local_ranks_from_environment(environment({{"SLURM_STEP_TASKS_PER_NODE", "4(x3),2(x2)"}, {"SLURM_NODEID", "3"}}))
          .value,
      2);
  // Open MPI's own count wins over Slurm's; a malformed value is skipped, not trusted.
  EXPECT_EQ(
      local_ranks_from_environment(environment({{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"SLURM_NTASKS_PER_NODE", "8"}}))
          .value,
      2);
  EXPECT_EQ(
      local_ranks_from_environment(environment({{"OMPI_COMM_WORLD_LOCAL_SIZE", "two"}, {"SLURM_NTASKS_PER_NODE", "8"}}))
          .value,
      8);
  EXPECT_EQ(local_ranks_from_environment(environment({{"OMPI_COMM_WORLD_LOCAL_SIZE", "0"}})).value, 1);
}

TEST(CpuBudget, SlurmTasksPerNode) {
  EXPECT_EQ(parse_slurm_tasks_per_node("2", std::nullopt), 2);
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x3),1", 0), 2);
  EXPECT_EQ(parse_slurm_tasks_per_node("2(x3),1", 3), 1);
  EXPECT_EQ(parse_slurm_tasks_per_node("1,5", std::nullopt), 5);  // unknown node: the largest
  EXPECT_EQ(parse_slurm_tasks_per_node("1,5", 9), 5);
  for (const char* bad : {"", "x", "2(x)", "2(3)", "2(x0)", "0"})
    EXPECT_EQ(parse_slurm_tasks_per_node(bad, 0), std::nullopt) << bad;
}

// A fake /proc and /sys: the files a path maps to.
ReadFile files(std::map<std::string, std::string> contents) {
  auto shared = std::make_shared<std::map<std::string, std::string>>(std::move(contents));
  return [shared](const std::string& path) -> std::optional<std::string> {
    auto it = shared->find(path);
    if (it == shared->end()) return std::nullopt;
    return it->second;
  };
}

const char* kV2Mount = "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

TEST(CpuBudget, CgroupV2QuotaOfTheOwnCgroupOrAnAncestor) {
  Quota own = cgroup_quota(files({{"/proc/self/cgroup", "0::/job/step\n"},
                                  {"/proc/self/mountinfo", kV2Mount},
                                  {"/sys/fs/cgroup/job/step/cpu.max", "150000 100000\n"},
                                  {"/sys/fs/cgroup/job/cpu.max", "max 100000\n"}}));
  EXPECT_DOUBLE_EQ(own.cores.value(), 1.5);
  EXPECT_EQ(own.source, "cgroup v2 /sys/fs/cgroup/job/step");
  // The parent's smaller quota binds the child too.
  Quota parent = cgroup_quota(files({{"/proc/self/cgroup", "0::/job/step\n"},
                                     {"/proc/self/mountinfo", kV2Mount},
                                     {"/sys/fs/cgroup/job/step/cpu.max", "max 100000\n"},
                                     {"/sys/fs/cgroup/job/cpu.max", "300000 100000\n"}}));
  EXPECT_DOUBLE_EQ(parent.cores.value(), 3.0);
  Quota none = cgroup_quota(files({{"/proc/self/cgroup", "0::/\n"}, {"/proc/self/mountinfo", kV2Mount}}));
  EXPECT_EQ(none.cores, std::nullopt);
}

TEST(CpuBudget, CgroupV1QuotaThroughTheCpuControllersMount) {
  const std::string mountinfo =
      "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
  Quota q = cgroup_quota(files({{"/proc/self/cgroup", "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"},
                                {"/proc/self/mountinfo", mountinfo},
                                {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "200000\n"},
                                {"/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"}}));
  EXPECT_DOUBLE_EQ(q.cores.value(), 2.0);
  EXPECT_EQ(q.source, "cgroup v1 /sys/fs/cgroup/cpu,cpuacct");
}

TEST(CpuBudget, UnreadableCgroupFilesMeanUnlimited) {
  EXPECT_EQ(cgroup_quota(files({})).cores, std::nullopt);
  EXPECT_EQ(cgroup_quota(files({{"/proc/self/cgroup", "garbage"}, {"/proc/self/mountinfo", "junk"}})).cores,
            std::nullopt);
}

TEST(CpuBudget, TheRealSystemGivesAtLeastOneThread) {
  CpuBudget budget = cpu_budget(read_cpu_facts());
  EXPECT_GE(budget.threads, 1);
  EXPECT_GE(budget.facts.affinity, 1);
}

TEST(OpenmpWait, TheSpinCountIsSetOnlyWhenTheUserChoseNoWaitPolicy) {
  EXPECT_EQ(spin_count_to_set(environment({}), 2), std::string(kSpinCount));
  EXPECT_EQ(spin_count_to_set(environment({{"OMP_WAIT_POLICY", "active"}}), 2), std::nullopt);
  EXPECT_EQ(spin_count_to_set(environment({{"GOMP_SPINCOUNT", "300000"}}), 2), std::nullopt);
}

TEST(OpenmpWait, OneThreadHasNothingToSpinSoNothingIsExecutedAgain) {
  EXPECT_EQ(spin_count_to_set(environment({}), 1), std::nullopt);
  EXPECT_EQ(spin_count_to_set(environment({{"OMP_NUM_THREADS", "1"}}), 1), std::nullopt);
}

}  // namespace
}  // namespace engine
