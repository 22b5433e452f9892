// Where a run's step executes: run.device resolved against the build and the machine.
//
//   cpu   always the CPU;
//   cuda  the first CUDA device, or a UserError (exit 2) where the build has no CUDA or the
//         machine no device;
//   auto  cuda when the build has CUDA, a device is present and the run is one the GPU path
//         supports (one process, ZeRO stage 0-1, no offload), else cpu; `note` says why when a
//         present GPU goes unused.
//
//   std::string note;
//   Device device = resolve_device(recipe, comm.size(), &note);
#pragma once

#include <string>

#include "core/tensor.h"
#include "recipe/recipe.h"

namespace engine {

struct CompiledStep;

Device resolve_device(const recipe::Recipe& recipe, int world, std::string* note = nullptr);

// "cpu" or "cuda:0 (NVIDIA H200)".
std::string describe_device(Device device);

// What a GPU run of `step` allocates on the device, by what it holds (runtime/device_runner.h,
// optim/device_optimizer.h): `engine plan` prints it. The library workspace is the runner's
// default; cuDNN's attention may ask for more, which only the device can say.
struct DeviceMemoryPlan {
  int64_t activations = 0, casts = 0, inputs = 0;  // the arena, the f32 copies of planned casts
  int64_t parameters = 0, gradients = 0;           // compute type, micro-batch gradient type
  int64_t masters = 0, optimizer_state = 0;        // fp32 (masters: 16-bit runs only)
  int64_t gradient_sum = 0;                        // accumulation > 1, and the fp32 gradients of 16-bit ones
  int64_t workspace = 0;
  int64_t total() const {
    return activations + casts + inputs + parameters + gradients + masters + optimizer_state + gradient_sum + workspace;
  }
};
DeviceMemoryPlan plan_device_memory(const CompiledStep& step, const recipe::Recipe& recipe);

}  // namespace engine
