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

Device resolve_device(const recipe::Recipe& recipe, int world, std::string* note = nullptr);

// "cpu" or "cuda:0 (NVIDIA H200)".
std::string describe_device(Device device);

}  // namespace engine
