// Where a run's step executes: run.device resolved against the build and the machine.
//
//   cpu   always the CPU;
//   cuda  a CUDA device (rank r of a machine's processes takes device r modulo the devices there),
//         or a UserError (exit 2) where the build has no CUDA or the machine no device;
//   auto  cuda when the build has CUDA and a device is present, else cpu.
//
// How a GPU run holds the model (device_resident): a run without offload, at any ZeRO stage and
// number of ranks, keeps its model state on the device (stages 1-3: its shard of the masters and the
// optimizer state; stage 3: of the parameters too) and updates it there; its ranks reduce their
// gradients (and ZeRO-3 gathers its units) on the device through the communicator
// make_device_collectives gives (NCCL, or staged through page-locked host memory where ranks share
// a GPU). A run with offload computes the step on the device and leaves the reductions, the update
// and the gathers to the host, staging each buffer through page-locked memory
// (runtime/device_runner.h).
//
//   Device device = resolve_device(recipe, comm.local_rank());
//   std::string how;
//   auto collectives = make_device_collectives(recipe, comm, device, &how);   // null: none needed
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/communicator.h"
#include "recipe/recipe.h"

namespace engine {

struct CompiledStep;

Device resolve_device(const recipe::Recipe& recipe, int local_rank);

// Whether `recipe` is planned as a GPU run here: run.device cuda (wherever it is planned), or auto
// on a machine with a GPU. What `engine plan` prints and fits device memory for.
bool planned_for_cuda(const recipe::Recipe& recipe);

// Whether a GPU run of `recipe` keeps the model state on the device (at any ZeRO stage and world
// size); when not, `why` names the offload tier that makes it staged.
bool device_resident(const recipe::Recipe& recipe, std::string* why = nullptr);

// Whether a resident GPU run of `recipe` at `world` ranks reduces its gradients through a device
// communicator: several ranks, or distributed.gpu_collectives named on one process.
bool uses_device_collectives(const recipe::Recipe& recipe, int world);

// The device communicator of a resident run over `host`'s ranks on `device` (a collective: every
// rank calls it), per distributed.gpu_collectives; null where none is used. `how` says which.
// UserError where the choice cannot run here (nccl without NCCL, or with ranks sharing a GPU).
std::unique_ptr<Communicator> make_device_collectives(const recipe::Recipe& recipe, Communicator& host, Device device,
                                                      std::string* how = nullptr);

// "cpu" or "cuda:0 (NVIDIA H200)".
std::string describe_device(Device device);

// What a GPU run of `step` allocates on the device, by what it holds (runtime/device_runner.h,
// optim/device_optimizer.h): `engine plan` prints it. The library workspace is the runner's
// default; cuDNN's attention may ask for more, which only the device can say.
struct DeviceMemoryPlan {
  int64_t activations = 0, casts = 0, inputs = 0;  // the arena, the f32 copies of planned casts
  int64_t parameters = 0, gradients = 0;           // compute type, micro-batch gradient type
  int64_t masters = 0, optimizer_state = 0;        // fp32 (masters: 16-bit runs only)
  int64_t gradient_sum = 0;                        // accumulation > 1, and the norm's partial sums
  int64_t reduce_staging = 0;                      // the peers' chunks of a device reduce-scatter
  int64_t workspace = 0;
  int64_t total() const {
    return activations + casts + inputs + parameters + gradients + masters + optimizer_state + gradient_sum +
           reduce_staging + workspace;
  }
};
// At `world` ranks: a resident run holds its state there (the optimizer's range of it: stages 1-3
// shard it, stage 3 the parameters too; and, reducing through a device communicator, the step's
// gradient sum and NCCL's reduce staging, one unit's gradient); a staged one the parameters (ZeRO
// 0-2) and the micro-batch gradients (ZeRO 0-1) beside the arena, which holds ZeRO-2/3's buffers.
DeviceMemoryPlan plan_device_memory(const CompiledStep& step, const recipe::Recipe& recipe, int world = 1);

}  // namespace engine
