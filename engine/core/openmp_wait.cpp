#include "core/openmp_wait.h"

#include <unistd.h>

#include <cstdlib>

#include "core/cpu_budget.h"

namespace engine {

std::optional<std::string> spin_count_to_set(const GetEnv& getenv, int openmp_threads) {
  // Either variable means the user (or a parent engine) already decided; the set variable is
  // also what stops the re-executed process from re-executing again.
  if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return std::nullopt;
  if (openmp_threads <= 1) return std::nullopt;  // no team, so no thread ever waits for work
  return std::string(kSpinCount);
}

void limit_openmp_spinning(char** argv) {
  std::optional<std::string> count =
      spin_count_to_set([](const char* name) { return std::getenv(name); }, planned_openmp_threads());
  if (!count) return;
  if (::setenv("GOMP_SPINCOUNT", count->c_str(), 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // exec failed (no /proc): carry on with libgomp's defaults; unset the variable so that child
  // engines do not believe the user chose it.
  ::unsetenv("GOMP_SPINCOUNT");
}

}  // namespace engine
