// ZeroStep: the communication of one ZeRO training step over a Communicator.
//
// During each micro-batch the executor hands it the plan's actions (dist/zero_plan.h): it starts
// the gathers of stage 3 and the gradient reduce-scatters, and waits for them where the plan says.
// Around the update it does what every rank must agree on: the whole gradient at stage 0, the
// global gradient norm (overflow and clipping), the parameters gathered after the update at
// stages 1-2, and the step's mean loss.
//
//   ZeroStep zero(store, comm);
//   for (micro...) { zero.begin_micro_batch(m); executor.run("train", step, j, scale, &zero); }
//   zero.finish_gradients();                  // reduced, widened to fp32 over the optimizer range
//   double norm = zero.gradient_norm();       // same bits at every world size and stage
//   ... clip, optimizer->step(lr) ...
//   zero.finish_update();                     // 16-bit copies, parameters gathered
#pragma once

#include <map>
#include <vector>

#include "dist/communicator.h"
#include "runtime/executor.h"
#include "runtime/parameters.h"

namespace engine {

// The whole fp32 parameters: views of the masters at stage 0 or on one rank, else gathered from
// every rank's shard (so creating one is a collective: every rank must).
class WholeParameters {
 public:
  WholeParameters(const ParameterStore& store, dist::Communicator& comm);
  const float* param(int index) const;

 private:
  const ParameterStore& store_;
  std::vector<Buffer> gathered_;  // per unit, when sharded
};

class ZeroStep : public StepCommunication {
 public:
  ZeroStep(ParameterStore& store, dist::Communicator& comm) : store_(store), comm_(comm) {}

  void begin_micro_batch(int64_t local_micro) { first_micro_ = local_micro == 0; }
  void run(const StepAction& action, std::byte* buffer) override;

  void finish_gradients();
  double gradient_norm();
  void finish_update();  // refresh_copies() and gather_parameters()
  // Stages 1-2 with several ranks: every rank's updated slice of the compute-dtype values, gathered.
  void gather_parameters();
  // The step's mean loss from each rank's per-micro-batch losses, summed in global micro-batch
  // order (micro-batch m of rank r is global micro-batch m * world + r), as one rank would.
  double mean_loss(const std::vector<double>& local_losses);
  // Every rank's `values` (the same count on each), rank after rank: rank r's at r * values.size().
  std::vector<double> gather(const std::vector<double>& values, const std::string& what);
  std::vector<double> gather(double value) { return gather(std::vector<double>{value}, "a value every rank needs"); }

  dist::Communicator& communicator() { return comm_; }

 private:
  ParameterStore& store_;
  dist::Communicator& comm_;
  bool first_micro_ = true;
  std::map<ValueId, dist::Work> gathers_;
  std::map<int, dist::Work> reductions_;
};

}  // namespace engine
