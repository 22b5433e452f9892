// Reruns of a recipe under the numeric environments this machine can force, for deriving a golden's
// tolerance band (golden/band.h). Each variant is a child process of the engine binary
// (`engine golden trajectory`), because oneDNN reads ONEDNN_MAX_CPU_ISA once per process. At a
// world size above 1 the child is `mpirun -n W --oversubscribe engine golden trajectory ...`, and so
// is the main run of record, update and check (run_trajectory_processes).
//
//   for (const VariantSpec& spec : default_variants(current_environment().threads))
//     runs.push_back(run_variant("/proc/self/exe", "recipes/golden/gpt_bf16.yaml", spec));
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "golden/band.h"
#include "golden/golden.h"

namespace engine {

struct VariantSpec {
  std::string max_cpu_isa;      // ONEDNN_MAX_CPU_ISA, "" for the machine's own
  int threads = 1;              // OMP_NUM_THREADS
  bool gradient_noise = false;  // golden/gradient_noise.h, for kernels this machine cannot force
  std::string label() const;
};

// ISA caps {machine, AVX512_CORE (no bf16 instructions), AVX2 (no AVX-512)} x threads {1, 2, 3, 4},
// less the recording itself: the kernels and ISAs machines differ by (AMX, AVX512-BF16, AVX-512,
// AVX2), and thread counts, which change dnnl_sgemm's blocking (and so its rounding) on AVX2.
// A cap above the machine's ISA leaves it as it is. Plus the recording's environment with one-ulp
// gradient noise: the rounding of kernels no cap can force here (AMX on a CPU without it).
std::vector<VariantSpec> default_variants(int recording_threads);

// Runs `engine golden trajectory` at `world` ranks under the variant; throws UserError if the
// child fails.
VariantRun run_variant(const std::filesystem::path& engine_binary, const std::filesystem::path& recipe,
                       const VariantSpec& spec, int world = 1);

// The recipe's run at `world` ranks in child processes, in this process's environment (or the
// variant's, when given): the file `engine golden trajectory` wrote, the environment of rank 0 and
// no band. Throws UserError if the run fails.
GoldenFile run_trajectory_processes(const std::filesystem::path& engine_binary, const std::filesystem::path& recipe,
                                    int world, const VariantSpec* spec = nullptr);

// mpirun from `path_list` (PATH's form: directories separated by ':'); throws UserError saying
// what to install when there is none.
std::filesystem::path find_mpirun(const char* path_list);

}  // namespace engine
