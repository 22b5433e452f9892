// DeviceOptimizer: the optimizer step of a GPU run, on the GPU, over model state that stays there
// between steps: the fp32 masters, the optimizer's moments and the step's gradient sum (read in
// its own type; an fp32 copy of 16-bit gradients only for a hook that reads or changes them),
// beside the DeviceRunner's compute-type parameters and micro-batch gradients. It applies
// the CPU's arithmetic in the CPU's order (optim/device_update.h: the micro-batch sum rounded in the
// gradient type, the norm's partial sums per kShardBlock block, clipping's scale, AdamW and SGD's
// FMA sequences, the rounding of the 16-bit copies), so a GPU run's update is the CPU's update of
// the same gradients.
//
// The host ParameterStore and Optimizer stay the model's record: upload() copies them to the device
// (before the first step, and after anything on the host changed them: initialisation, loaded
// weights, a restored checkpoint); download() copies the device's state back (before a checkpoint,
// an export, a golden digest or any host reader). Any ZeRO stage, without offload.
//
// Several ranks (or one that names distributed.gpu_collectives) reduce each micro-batch's gradients
// on the device through `collectives` (NCCL, or the staged communicator: trainer/device.h): a
// reduce-scatter of every unit into this rank's shard of the step's sum, adding in rank order onto
// what the earlier micro-batches left there (Communicator's promise: world w accumulating a gives
// the bits of one process accumulating w x a in global micro-batch order). Each unit's starts where
// the runner's plan places its reduce, as soon as the backward has written it, and the stream
// waits for it at the plan's wait (DevicePlanActions, which the runner calls), so the reductions
// overlap the backward of the units before them. Then:
//   stage 0  after the last micro-batch's run, an all-gather of each unit's sum shards, so every
//            rank holds the whole reduced sum and makes the same update of the whole model;
//   stage 1  each rank's masters, optimizer state and sum are its shard (the store's optimizer
//            range); the norm's partial sums are gathered per unit into one process's list (less
//            the padding blocks: ZeroStep::gradient_norm's list), so every rank decides alike;
//            each rank updates its shard, and the compute-type parameters are gathered in place.
//   stage 2  as stage 1, but the micro-batch gradients are the plan's arena buffers, reused once
//            the plan's wait for their reduction has passed: no rank holds the whole gradient.
//   stage 3  as stage 2, and the compute-type parameters are this rank's shard alone: the update
//            writes it, and each plan's gather all-gathers a unit into its arena buffer, used at
//            the plan's use_params. One process copies and adds those on the stream itself.
// The collectives run on the communicator's stream after the runner's and the runner's stream waits
// for them; the host waits for them (within distributed.timeout) only where it next blocks on the
// stream (the staged communicator waits at each, for its copies).
//
// The update is one multi-tensor kernel over the whole model state (optim/update_chunks.h): each
// gradient scaled by the step's factor, AdamW or SGD, the 16-bit copy written.
//
//   auto device = make_device_optimizer(recipe.optimizer, store, *optimizer, runner, accumulation);
//   device->upload();
//   for (micro ...) { device->begin_micro_batch(micro); executor.run("train", ...); device->add_micro_batch(micro); }
//   const DeviceOptimizer::StepEnd end = device->finish_and_step(lr, policy);   // one wait, mid-update
//
// or, where the host must see the gradients or the norm before the update (a plugin's hook):
//   double norm = sum_norm_partials(device->finish_gradients());
//   device->step(lr, factor);
//
// With use_graphs(true), each phase (a micro-batch's sum, the gradients' finish, the update) runs
// as a CUDA graph from its second run on (runtime/stream_graphs.h); the learning rate's scalars,
// the policy and the factor reach the kernels through device memory.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "optim/optimizer.h"
#include "optim/update_math.h"
#include "runtime/device_runner.h"
#include "runtime/parameters.h"

namespace engine {

class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  virtual void upload() = 0;    // host masters, compute copies and optimizer state -> device
  virtual void download() = 0;  // device -> host (the masters, copies and state a reader sees)
  // Before micro-batch `micro` of a step runs (ZeRO-2/3's reductions, in its plan, overwrite the
  // step's sum at micro-batch 0 and add to it after), and after it ran its backward: adds its
  // gradients to the step's sum (stages 0-1).
  virtual void begin_micro_batch(int64_t micro) = 0;
  virtual void add_micro_batch(int64_t micro) = 0;
  // Returns the norm's partial sums of the gradients the update will read (the step's sum, or the
  // fp32 gradients a hook uploaded), one process's list (ZeroStep::whole_gradient_norm's).
  virtual std::vector<double> finish_gradients() = 0;
  // Waits for the device collectives in flight, within distributed.timeout (NCCL's polled with its
  // asynchronous error): what the host calls before it blocks on the stream that waits for them.
  virtual void wait_for_collectives() = 0;
  // The fp32 gradients to the host store's opt_grad and back (hooks that read or change them).
  virtual void download_gradients() = 0;
  virtual void upload_gradients() = 0;
  // The masters' norm partial sums (optimizer.h master_norm_partials), computed where they live.
  virtual std::vector<double> master_norm_partials() = 0;
  // One update at learning rate `lr` of the gradients times `factor` (clipping and loss scaling,
  // as optimizer.h scale_gradients), then the 16-bit copies; the host optimizer counts it.
  virtual void step(double lr, double factor) = 0;

  // The step's end decided on the device: the gradients' finish, their norm (sum_norm_partials's
  // order), the decision under `policy` (update_math.h decide_update) and the update at `lr`, with
  // nothing read back in between. Returns once the decision and the norm's partial sums are on the
  // host (and what the runner kept of the step's runs: DeviceRunner::keep_value), while the update
  // may still be running. The host optimizer counts the update unless the decision skipped it.
  struct StepEnd {
    std::vector<double> partials;  // the norm's partial sums, as finish_gradients returns them
    UpdateDecision decision;
  };
  virtual StepEnd finish_and_step(double lr, const StepPolicy& policy) = 0;

  // The gathers and reduce-scatters of the runner's plans, which it carries out through its
  // collectives (DeviceRunner::set_resident takes them): at ZeRO-2/3, and at any stage where ranks
  // reduce through a device communicator; null otherwise.
  virtual DevicePlanActions* plan_actions() = 0;

  virtual void use_graphs(bool on) = 0;
  virtual void reset_graphs() = 0;            // what the phases enqueue changed (a value's type)
  virtual int64_t graph_replays() const = 0;  // phases a CUDA graph ran so far
};

// Needs a CUDA build (a UserError otherwise). `collectives`: the device communicator over the
// data-parallel ranks (null: one process, whose sum is its own micro-batches').
std::unique_ptr<DeviceOptimizer> make_device_optimizer(const recipe::OptimizerSection& config, ParameterStore& store,
                                                       Optimizer& host, DeviceRunner& runner, int64_t accumulation,
                                                       Communicator* collectives = nullptr);

}  // namespace engine
