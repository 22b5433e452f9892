#include "trainer/step_decisions.h"

#include <vector>

#include "dist/communicator.h"

namespace engine {

StepDecisions agree(const StepDecisions& mine, Communicator& comm) {
  const int world = comm.size();
  if (world == 1) return mine;
  const std::vector<double> flags{mine.stop_signal ? 1.0 : 0.0, mine.plugin_stop ? 1.0 : 0.0,
                                  mine.checkpoint_requested ? 1.0 : 0.0, mine.checkpoint_due_by_time ? 1.0 : 0.0,
                                  mine.seconds_since_signal};
  const std::vector<double> all = gather_values(comm, flags, "the step's stop and checkpoint decisions");
  const auto any = [&](size_t k) {
    for (int rank = 0; rank < world; ++rank)
      if (all[size_t(rank) * flags.size() + k] != 0) return true;
    return false;
  };
  return {.stop_signal = any(0),
          .plugin_stop = any(1),
          .checkpoint_requested = any(2),
          .checkpoint_due_by_time = all[3] != 0,  // rank 0's
          .seconds_since_signal = all[4]};
}

}  // namespace engine
