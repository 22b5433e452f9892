// What `engine train` says about a run at its start (the device, model, data, ranks, memory plan
// and offloaded state) and, on a GPU, at its end (device memory against the plan, and where the
// host's time per step went).
//
//   report_start(out, session, comm, compiled.traffic);
//   ... train ...
//   report_device(out, session, steps_trained, seconds);
#pragma once

#include <cstdint>
#include <ostream>

#include "dist/communicator.h"
#include "trainer/session.h"

namespace engine {

void report_start(std::ostream& out, const Session& session, const Communicator& comm, const TrafficPlan& traffic);
void report_device(std::ostream& out, const Session& session, int64_t trained, double train_seconds);

}  // namespace engine
