#include "trainer/device.h"

#include "core/build_flags.h"
#include "core/device_info.h"
#include "core/error.h"
#include "recipe/rules.h"

namespace engine {

Device resolve_device(const recipe::Recipe& recipe, int world, std::string* note) {
  const Device cpu{};
  const Device cuda{Device::Kind::cuda, 0};
  const int devices = cuda_device_count();
  std::string limitation = recipe::cuda_limitation(recipe);
  if (limitation.empty() && world > 1)
    limitation = "runs of several processes (" + std::to_string(world) + " ranks) train on the CPU in this version";
  switch (recipe.run.device) {
    case recipe::RunDevice::cpu:
      return cpu;
    case recipe::RunDevice::cuda:
      if (devices == 0)
        throw UserError(
            std::string("run.device: cuda, but ") +
            (kHaveCuda ? "no CUDA device is present on this machine" : "this engine was built without CUDA") +
            "; use run.device: cpu or auto");
      if (!limitation.empty()) throw UserError("run.device: cuda: " + limitation + "; use run.device: cpu");
      return cuda;
    case recipe::RunDevice::auto_detect:
      if (devices == 0) return cpu;
      if (!limitation.empty()) {
        if (note) *note = "run.device auto: a GPU is present, but " + limitation + ": training on the CPU";
        return cpu;
      }
      return cuda;
  }
  return cpu;
}

std::string describe_device(Device device) {
  if (device.kind == Device::Kind::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index) + " (" + cuda_device_name(device.index) + ")";
}

}  // namespace engine
