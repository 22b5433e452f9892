// The CPU budget: how many OpenMP threads one rank may run without fighting its neighbours.
//
// A process may use min(CPUs in its affinity mask, its cgroup CPU quota rounded up) cores, shared
// by the ranks the launcher placed on this machine; each rank gets its share, at least one thread.
// OpenMP's default (one spinning thread per core in every process) makes two ranks on two cores
// spend most of their time spinning against each other; see docs/threads.md for measurements.
//
// The arithmetic and the parsing take their inputs as values, so tests need no real system:
//
//   CpuFacts facts = read_cpu_facts();          // affinity, cgroup, launcher environment
//   CpuBudget budget = cpu_budget(facts);       // budget.threads, budget.describe()
//   omp_set_num_threads(budget.threads);
//
// apply_cpu_budget() does exactly that at startup, unless the user set OMP_NUM_THREADS.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "core/launcher.h"

namespace engine {

// Reads a whole file: nullopt when it does not exist or cannot be read.
using ReadFile = std::function<std::optional<std::string>(const std::string& path)>;

// A count and where it came from, for the startup note.
struct Counted {
  int value = 1;
  std::string source;  // "OMPI_COMM_WORLD_LOCAL_SIZE=2"; empty when nothing said so
};

// What the system says about the CPUs this process may use.
struct CpuFacts {
  int affinity = 1;             // CPUs in the sched_getaffinity mask
  std::optional<double> quota;  // cgroup CPU quota in cores (1.5 = 150 ms per 100 ms); nullopt: unlimited
  std::string quota_source;     // "cgroup v2 /sys/fs/cgroup/x/cpu.max"; empty when unlimited
  Counted local_ranks;          // ranks of this job on this machine (1 when not launched by mpirun/srun)
};

struct CpuBudget {
  int cores = 1;    // min(affinity, ceil(quota))
  int threads = 1;  // cores / local ranks, at least 1
  CpuFacts facts;

  // "2 threads (affinity 2 cores, cgroup unlimited, 1 rank on this machine)"
  std::string describe() const;
};

CpuBudget cpu_budget(const CpuFacts& facts);

// cgroup v2 cpu.max: "max 100000" -> nullopt (unlimited); "150000 100000" -> 1.5 cores.
// Malformed text also gives nullopt: a file we cannot read must not stop training.
std::optional<double> parse_cpu_max(std::string_view text);
// cgroup v1: cpu.cfs_quota_us ("-1" is unlimited) over cpu.cfs_period_us.
std::optional<double> parse_cfs_quota(std::string_view quota_us, std::string_view period_us);

// The launcher's count of ranks on this machine: OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI),
// MPI_LOCALNRANKS (MPICH), SLURM_STEP_TASKS_PER_NODE (with SLURM_NODEID) or SLURM_NTASKS_PER_NODE;
// the first that holds a positive count wins, 1 when none does.
Counted local_ranks_from_environment(const GetEnv& getenv);
// Slurm's per-node task list, "2(x3),1": the entry for node `node` (nullopt: unknown node, the largest).
std::optional<int> parse_slurm_tasks_per_node(std::string_view text, std::optional<int> node);

// The cgroup quota of the process whose /proc/self/cgroup and /proc/self/mountinfo `read` returns,
// the smallest along its cgroup and the cgroup's ancestors (v2), or its own cpu controller's (v1).
struct Quota {
  std::optional<double> cores;
  std::string source;
};
Quota cgroup_quota(const ReadFile& read);

// The real system: sched_getaffinity, /proc/self/..., the process environment.
CpuFacts read_cpu_facts();

// What apply_cpu_budget decided, for the startup note (logged once logging is set up).
struct ThreadChoice {
  int threads = 1;
  std::string note;  // "2 threads (affinity 2 cores, ...)" or "3 threads (OMP_NUM_THREADS=3)"
};
// Sets the OpenMP thread count from the budget, unless OMP_NUM_THREADS is set (then it is kept).
ThreadChoice apply_cpu_budget();
// The thread count apply_cpu_budget() sets (OMP_NUM_THREADS's, else the budget's), without setting it.
int planned_openmp_threads();

}  // namespace engine
