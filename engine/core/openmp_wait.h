// How long an idle OpenMP thread spins before it sleeps.
//
// libgomp spins 300,000 times (a few milliseconds) between parallel regions before it waits on
// a futex. On a machine of its own that costs nothing, but beside any other busy process (another
// rank, a build, a data loader) the spinning threads take the cores the working threads need: the
// quick start ran 3-8x slower (docs/threads.md). A spin count of kSpinCount keeps the lone
// speed and gives the cores back.
//
// libgomp reads GOMP_SPINCOUNT and OMP_WAIT_POLICY once, when it is loaded, before main() runs, so
// the engine sets the variable and executes itself again at the very start:
//
//   int main(int argc, char** argv) { engine::limit_openmp_spinning(argv); ... }
//
// A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept as it is (and nothing is re-executed).
// Nor is a process that will run one OpenMP thread (OMP_NUM_THREADS=1, or a rank whose share of the
// cores is one): it has no idle thread to spin, and executing again would only pay the start-up
// twice (loading and initialising the libraries: about 30 ms per rank).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "core/launcher.h"

namespace engine {

inline constexpr const char* kSpinCount = "1000";

// The GOMP_SPINCOUNT to set, or nullopt when the user already chose a wait policy or the process
// runs `openmp_threads` = 1.
std::optional<std::string> spin_count_to_set(const GetEnv& getenv, int openmp_threads);

// Sets GOMP_SPINCOUNT and re-executes /proc/self/exe with the same arguments when
// spin_count_to_set says so. Returns only when nothing was re-executed (or exec failed: the run
// then goes on with libgomp's default, which is slower beside other work but correct).
void limit_openmp_spinning(char** argv);

}  // namespace engine
