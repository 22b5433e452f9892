// StopSignals: preemption by SIGTERM, SIGINT or SIGUSR1 while `engine train` runs its loop.
//
// The first signal only records that a stop was asked for (and when): the loop finishes its step,
// the ranks agree on it, and a checkpoint is written within checkpoint.preemption_budget. A second
// signal ends the process at once with kExitRequeue; committed checkpoints stay intact. Under a
// launcher, output that cannot be written at once is dropped after the first signal (mpirun stops
// reading the ranks' output when it is signalled).
//
//   StopSignals signals(comm.size() > 1);      // installed until the object goes
//   if (StopSignals::received()) ... StopSignals::seconds_since() ...
#pragma once

#include <csignal>
#include <cstddef>

namespace engine {

class StopSignals {
 public:
  static constexpr size_t kSignals = 3;  // SIGTERM, SIGINT, SIGUSR1

  explicit StopSignals(bool launched_rank);
  ~StopSignals();  // puts the previous handlers back, unless a stop was asked for
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  static bool received();
  static double seconds_since();  // since the first signal (0 without one)

 private:
  struct sigaction previous_[kSignals];
};

}  // namespace engine
