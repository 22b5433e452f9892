// DeviceRunner: the part of the Executor that replays plans on a CUDA device. It owns the device
// memory of a step, one allocator per kind:
//   device   the activation arena (the plan's offsets, unchanged), the f32 scratch of the planned
//            casts, the parameters in the compute type and their gradients (one buffer per wrap
//            unit, laid out as the ParameterStore's), the step's inputs, the library workspace;
//   pinned   host values (cpu_checkpointing's activations moved out of the arena), the inputs'
//            staging, and the ParameterStore's own buffers, registered so their copies run as DMA.
// The ParameterStore on the host stays the owner of the model's state: the optimizer, ZeRO's host
// side, checkpoints and plugins see the same buffers at every device.
//
// Two ways to run (trainer/device.h device_resident):
//   resident  no offload, any ZeRO stage and world size: the parameters and gradients (ZeRO-3: the
//             parameters' shard; ZeRO-2/3: the step's sum) stay on the device between steps and the
//             device optimizer updates them there; the plan's kernels replay on one stream, as CUDA
//             graphs after the first runs (a plan whose actions gather or reduce-scatter on the
//             device, DevicePlanActions: one graph per run of kernels between two actions).
//   staged    a run with offload: uploads the store's compute-type parameters (ZeRO 0-2) where the
//             host changed them (parameters_changed; unit by unit on the copy stream, each waited
//             for by the first node that reads it), replays the plan's nodes and carries out its
//             actions on the host between them through page-locked mirrors of the arena's buffers:
//             ZeRO-3's gathers are uploaded where the plan uses them. Gradients go to the host on
//             a download stream of their own, each behind the kernels that wrote it, while the
//             backward goes on: ZeRO-2/3's buffers where the plan reduce-scatters them (the host
//             hands each to the collective at the next reduce or the unit's wait, having enqueued
//             the kernels in between, so the device computes while the host waits and reduces),
//             the store's gradients (ZeRO 0-1) unit by unit after the last node that writes each,
//             reduced in plan order after the run.
//             The host then reduces, updates (offloaded or not) and gathers as on a CPU run, so a
//             staged run gives the bits of the same run on one process.
// Each node runs its CUDA kernel, with its 16-bit values widened into the scratch and rounded back
// where its OpDef::cuda_16bit is unset.
//
//   auto runner = make_device_runner(graph, store, /*device index*/ 0);   // UserError without CUDA
//   runner->add_plan("train", plan);
//   runner->run("train", plan, ctx, host_inputs, nullptr, &zero_step);
//   const float* losses = runner->value_f32("train", plan, losses_id);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "core/buffer.h"
#include "graph/op.h"
#include "plan/plan.h"
#include "runtime/parameters.h"

namespace engine {

struct OpTotals;

// The library workspace a runner allocates at least (cuBLASLt asks for up to 32 MiB on Hopper; the
// engine's kernels keep per-block partial sums in it); a node may ask for more (OpDef::cuda_workspace).
inline constexpr int64_t kDeviceWorkspaceBytes = int64_t(64) << 20;
class StepCommunication;

// What the runner holds, by memory kind, and the device's own view.
struct DeviceMemory {
  int64_t device = 0;       // bytes allocated on the device now
  int64_t device_peak = 0;  // the allocator's high-water mark
  int64_t pinned = 0;       // page-locked host bytes allocated (not counting registered store buffers)
  int64_t device_used = 0;  // cudaMemGetInfo: total minus free, every process and context included
  int64_t device_total = 0;
  std::string name;  // the device's name
};

// Where the host's time went in the runner's replays: enqueuing the kernels, and waiting for the
// device to finish them (the device's own time, less what the enqueuing overlapped).
struct DeviceTimes {
  int64_t runs = 0;
  int64_t parameter_uploads = 0;  // staged runs that uploaded the store's parameters (parameters_changed)
  int64_t staged_ahead = 0;       // runs whose inputs were already on their way (stage_inputs) when run() began
  double enqueue_seconds = 0, wait_seconds = 0;
  int64_t waits = 0;  // the times the host blocked until the device caught up (resident runs: once a step)
};

// The plan's actions on a resident run's device buffers (ZeRO-2/3, and the reductions of ranks
// reducing through a device communicator at any stage): the device optimizer carries them out
// through its collectives, in the runner's stream order (optim/device_optimizer.h).
class DevicePlanActions {
 public:
  virtual ~DevicePlanActions() = default;
  // Starts gathering `unit`'s compute-type parameters (the whole padded unit) into `into`, an arena
  // buffer, behind the stream's work so far.
  virtual void gather(int unit, std::byte* into) = 0;
  // The stream's next kernels read the parameters gathered into `gathered`: it waits for that gather.
  virtual void use_params(int unit, const std::byte* gathered) = 0;
  // Starts reducing `unit`'s micro-batch gradients (the whole padded unit: `gradients`, an arena
  // buffer at ZeRO-2/3; null at stages 0-1, the runner's gradients(unit)) into this rank's shard of
  // the step's sum, behind the kernels that wrote them.
  virtual void reduce(int unit, const std::byte* gradients) = 0;
  // The stream's next kernels may reuse that buffer: it waits for the reduction.
  virtual void wait(int unit) = 0;
  // The host waits for the collectives the stream waits on, within distributed.timeout (a peer
  // that never reaches one is named), before it blocks on the stream itself.
  virtual void wait_for_collectives() = 0;
};

class DeviceRunner {
 public:
  virtual ~DeviceRunner() = default;
  // Plans share the arena and the scratch, sized for the largest.
  virtual void add_plan(const std::string& name, const Plan& plan) = 0;
  // One replay of `plan`. `ctx` carries the step's identity (seed, step, micro_step, training,
  // loss scale); `inputs` the host values the trainer filled (by ValueId). With `op_totals`, every
  // kernel is timed with events and summed per op. Returns once the device is done, except a
  // resident run without op_totals or a trace, which returns once its kernels are enqueued: what
  // the host reads of it (value_f32, kept_f32, the device optimizer) waits for it there.
  // `communication` carries out the plan's actions (staged runs; a resident run's device optimizer
  // sums its micro-batches itself).
  virtual void run(const std::string& name, const Plan& plan, KernelContext ctx,
                   const std::map<ValueId, Buffer>& inputs, std::map<std::string, OpTotals>* op_totals,
                   StepCommunication* communication) = 0;
  // The step's inputs on their way to the device ahead of the run() that reads them: copied into
  // page-locked staging, then to the device on a copy stream of their own once the last run's
  // kernels are done reading the previous ones. A trainer stages the next batch as soon as it has
  // it, so the copy overlaps the previous step's tail (the update, which runs without the host
  // waiting). run() stages the inputs itself where nothing was staged since the last run.
  virtual void stage_inputs(const std::map<ValueId, Buffer>& inputs) = 0;
  // An activation of the last run of `name`, copied to the host and widened to f32 (waits for the
  // device).
  virtual const float* value_f32(const std::string& name, const Plan& plan, ValueId id) = 0;
  // The same without waiting: the copy of `id` from the last run of `name` is enqueued behind it
  // into page-locked slot `slot`, and kept_f32(slot) reads it once it is there (a micro-batch's
  // losses, read once at the step's end).
  virtual void keep_value(const std::string& name, const Plan& plan, ValueId id, int slot) = 0;
  virtual const float* kept_f32(int slot) = 0;
  // Waits for `event` (a cudaEvent_t recorded on stream()), or for everything on stream(); counted
  // in times() as the host's waits for the device.
  virtual void wait(void* event, const std::string& what) = 0;
  virtual void synchronize(const std::string& what) = 0;
  virtual DeviceMemory memory() const = 0;
  virtual DeviceTimes times() const = 0;

  // Resident model state (optim/device_optimizer.h): run() then neither uploads the parameters nor
  // downloads the gradients nor runs the plan's host reductions; the device optimizer reads the
  // gradients and writes the parameters where they are. With `actions` (ZeRO-2/3, or ranks that
  // reduce through a device communicator), the plan's gathers and reduce-scatters run through them
  // where the plan places them, eagerly between CUDA graphs of the kernels around them.
  virtual void set_resident(bool resident, DevicePlanActions* actions = nullptr) = 0;
  // The unit's compute-type parameters (padded; null at ZeRO-3, whose units are gathered into the
  // arena) and micro-batch gradients (padded; null at ZeRO-2/3, which writes them into the arena).
  virtual std::byte* parameters(size_t unit) = 0;
  virtual std::byte* gradients(size_t unit) = 0;
  // A staged run uploads the store's compute-type parameters at its first run and at the first run
  // after this call: the host changed them (an update, a restore, loaded weights, fp16's fallback).
  // In between, runs reuse them (a step's later micro-batches, the evaluation after an update).
  virtual void parameters_changed() = 0;
  virtual void* stream() = 0;  // the cudaStream_t the steps run on

  // CUDA graphs (resident runs without op_totals): a plan's first run is eager, its second is
  // captured as a graph and every later one replays it. The step's identity reaches the kernels
  // through KernelContext::step_scalars, in device memory, so replays need no re-capture.
  // reset_graphs() drops them: anything a kernel chose at enqueue time (a value's type) changed.
  virtual void use_graphs(bool on) = 0;
  virtual void reset_graphs() = 0;
  virtual int64_t graph_replays() const = 0;  // captured graphs launched so far (a segmented plan: one a segment)
  // Device memory counted in memory(), for state that lives beside the runner's.
  virtual std::byte* allocate(int64_t bytes, const std::string& what) = 0;
};

// The runner on CUDA device `index`; a UserError in a build without CUDA or without that device.
std::unique_ptr<DeviceRunner> make_device_runner(const Graph& graph, ParameterStore& parameters, int index);

// The f32 scratch bytes the planned casts of `plan` need on CUDA (the largest node's).
int64_t cuda_scratch_bytes(const Graph& graph, const Plan& plan);

}  // namespace engine
