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

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "runtime/executor.h"
#include "runtime/parameters.h"

namespace engine {

// The whole fp32 parameters: views of the masters at stage 0 or on one rank, else gathered from
// every rank's shard (so creating one is a collective: every rank must). Offloaded masters on one
// rank are read a unit at a time, as param() asks for them.
class WholeParameters {
 public:
  WholeParameters(const ParameterStore& store, Communicator& comm);
  const float* param(int index) const;

 private:
  const ParameterStore& store_;
  std::vector<Buffer> gathered_;  // per unit, when sharded
  mutable Buffer unit_;           // offloaded masters on one rank: the unit last read
  mutable int unit_index_ = -1;
};

class ZeroStep : public StepCommunication {
 public:
  // prefetch: gathers in flight ahead of the one in use (distributed.prefetch).
  ZeroStep(ParameterStore& store, Communicator& comm, int64_t prefetch = 1)
      : store_(store), comm_(comm), prefetch_(prefetch) {}

  void begin_micro_batch(int64_t local_micro) { first_micro_ = local_micro == 0; }
  // Before each run of a plan: the units its gathers read, in order (gather_sequence()), so that an
  // offloaded shard is read one gather ahead of its use.
  void begin_pass(const std::vector<int>& gathers);
  // Fetch slots of the offloaded shard: the gathers in flight (prefetch + 1) and the one read ahead.
  static int fetch_slots(int64_t prefetch) { return int(prefetch) + 2; }
  void run(const StepAction& action, std::byte* buffer) override;

  void finish_gradients();
  double gradient_norm();
  // The same from this rank's partial sums (optimizer.h gradient_norm_partials), computed elsewhere
  // (the device optimizer's).
  double gradient_norm(std::vector<double> partials);
  // The same from partial sums over every unit's value blocks (unit, block order; no padding
  // blocks), which every rank holds alike: a resident GPU run's device optimizer, at any world
  // size. No communication.
  double whole_gradient_norm(const std::vector<double>& partials);
  // Each wrap unit's share of the last gradient_norm(): the L2 norm of its gradient (as scaled
  // then), summed over the ranks' shards; no communication of its own.
  const std::vector<double>& unit_gradient_norms() const { return unit_gradient_norms_; }
  // Each wrap unit's fp32 master norm; a collective (every rank calls it at the same step). Empty
  // when the masters are offloaded (reading them back is not cheap).
  std::vector<double> unit_parameter_norms();
  // The same from this rank's partial sums of the masters (computed elsewhere).
  std::vector<double> unit_parameter_norms(std::vector<double> partials);
  // The same from partial sums over every unit's value blocks of the masters (a resident GPU
  // run's); no communication.
  std::vector<double> whole_unit_parameter_norms(const std::vector<double>& partials);
  // refresh_copies() (unless the optimizer wrote the copies) and gather_parameters()
  void finish_update(bool refresh = true);
  // Stages 1-2 with several ranks: every rank's updated slice of the compute-dtype values, gathered.
  void gather_parameters();
  // After ParameterStore::initialize(seed, true), where it drew only shards at stages 0-2: every
  // rank's shard of the compute values (and of stage 0's fp32 masters where they are separate),
  // gathered, so that each rank holds the whole model. A collective; nothing where nothing is missing.
  void gather_drawn_shards();
  // The step's mean loss from each rank's per-micro-batch losses, summed in global micro-batch
  // order (micro-batch m of rank r is global micro-batch m * world + r), as one rank would.
  double mean_loss(const std::vector<double>& local_losses);
  // Every rank's `values` (the same count on each), rank after rank: rank r's at r * values.size().
  std::vector<double> gather(const std::vector<double>& values, const std::string& what);
  std::vector<double> gather(double value) { return gather(std::vector<double>{value}, "a value every rank needs"); }

  Communicator& communicator() { return comm_; }
  // Tensor parallelism: the gradient norm sums the tensor-parallel group's partials too (each rank's
  // split weights, the whole ones once). Null or size 1: none.
  void set_tensor_group(Communicator* tensor) { tensor_ = tensor && tensor->size() > 1 ? tensor : nullptr; }
  // Pipeline parallelism: the gradient norm adds the other stages' sums of squares (one rank of each
  // in `group`), over this stage's units that `counted` marks (a weight two stages hold counts once).
  void set_pipeline_group(Communicator* group, std::vector<bool> counted) {
    pipeline_ = group;
    counted_units_ = std::move(counted);
  }

 private:
  // Each unit's rank shards of a whole-unit buffer, `whole(u)` (null: none for that unit), of
  // `element`-byte values, gathered in place.
  void gather_whole_units(const std::function<std::byte*(size_t)>& whole, int64_t element, const std::string& what);
  std::vector<double> unit_gradient_norms_;
  std::vector<double> rank_major_to_unit_major(const std::vector<double>& all, size_t per_rank) const;
  ParameterStore& store_;
  Communicator& comm_;
  Communicator* tensor_ = nullptr;
  Communicator* pipeline_ = nullptr;
  std::vector<bool> counted_units_;
  int64_t prefetch_;
  bool first_micro_ = true;
  std::map<ValueId, Work> gathers_;
  std::map<int, Work> reductions_;
  // The offloaded shard's reads: gather i of the pass reads into fetch slot i % slots.
  const std::byte* fetched_source(int unit);
  void fetch(size_t gather);
  std::vector<int> sequence_;
  size_t position_ = 0, fetched_ = 0;
  int slots_ = 0;
};

// A unit-major list of partial sums over every unit's padded blocks (unit, rank, block), less each
// unit's padding blocks (ShardLayout::value_blocks): what the gradient norm sums, the same list at
// every world size (sum_norm_partials' chunks would otherwise fall elsewhere as the padding grows).
std::vector<double> without_padding_blocks(const ShardLayout& layout, const std::vector<double>& unit_major);

// The units a plan's gathers read, in the order they start.
std::vector<int> gather_sequence(const Plan& plan);

}  // namespace engine
