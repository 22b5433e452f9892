// What `engine train` says about offload: where each kind of state lives at start, and per logged
// step the swap traffic measured against the plan's.
//
//   if (session.offloaded) describe_offload(out, session, compiled.traffic);
//   SwapWindow window(session.offloaded.get());
//   window.log(*session.offloaded, step, line);   // swap_read, swap_written, swap_wait_s, the
//                                                  // offloaded update's chunks and (ZeRO-3 with the
//                                                  // parameters offloaded) the shard bytes the
//                                                  // gathers read, per step
#pragma once

#include <nlohmann/json.hpp>
#include <ostream>

#include "trainer/session.h"

namespace engine {

void describe_offload(std::ostream& out, const Session& session, const TrafficPlan& traffic);

// The swap counters since the last logged step, as per-step averages in a metrics line.
class SwapWindow {
 public:
  explicit SwapWindow(const OffloadedState* state, int64_t step = 0);
  void log(const OffloadedState& state, int64_t step, nlohmann::json& line);

 private:
  int64_t step_ = 0, read_ = 0, written_ = 0, chunks_ = 0, fetched_ = 0;
  double wait_ = 0;
};

}  // namespace engine
