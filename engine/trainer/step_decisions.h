// StepDecisions: what every rank must agree on at a step end, so that all stop, checkpoint and
// evaluate at the same step. Signals reach the ranks at different times, plugins decide on what
// their rank sees, and rank 0's clock decides time-based checkpoints: agree() gathers each rank's
// view, and a stop or a checkpoint request on any rank counts for all, while the time-based
// checkpoint and the seconds since the signal are rank 0's.
//
//   StepDecisions mine{.stop_signal = StopSignals::received(), .plugin_stop = plugins.stop_reason().has_value()};
//   const StepDecisions all = agree(mine, world);   // every rank of the world, whatever its groups
//   if (all.stop_signal) ...   // every rank sees the same decisions
#pragma once

namespace engine {

class Communicator;

struct StepDecisions {
  bool stop_signal = false;             // SIGTERM, SIGINT or SIGUSR1 arrived: preempted
  bool plugin_stop = false;             // a plugin asked the run to stop
  bool checkpoint_requested = false;    // a plugin asked for a checkpoint
  bool checkpoint_due_by_time = false;  // checkpoint.every_minutes have passed (rank 0's clock)
  double seconds_since_signal = 0;      // rank 0's
};

// The decisions of every rank of `world` combined (every rank calls it at the same point).
StepDecisions agree(const StepDecisions& mine, Communicator& world);

}  // namespace engine
