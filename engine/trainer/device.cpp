#include "trainer/device.h"

#include "core/build_flags.h"
#include "core/device_info.h"
#include "core/error.h"
#include "recipe/rules.h"
#include "runtime/device_runner.h"
#include "trainer/session.h"

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

DeviceMemoryPlan plan_device_memory(const CompiledStep& step, const recipe::Recipe& recipe) {
  const Graph& g = step.model.graph;
  const ShardLayout layout(g.units(), 1, 0);
  int64_t elements = 0;
  for (size_t u = 0; u < layout.units(); ++u) elements += layout.padded(u);
  const auto param = int64_t(dtype_size(g.param_dtype())), grad = int64_t(dtype_size(g.grad_dtype()));
  DeviceMemoryPlan m;
  m.activations = std::max(step.train.arena_bytes, step.eval.arena_bytes);
  m.casts = std::max(cuda_scratch_bytes(g, step.train), cuda_scratch_bytes(g, step.eval));
  m.inputs = step.memory.inputs;
  m.parameters = elements * param;
  m.gradients = elements * grad;
  m.masters = param == 4 ? 0 : elements * 4;
  m.optimizer_state = int64_t(optimizer_state_tensors(recipe.optimizer)) * elements * 4;
  m.gradient_sum = (step.sharding.accumulation > 1 ? elements * grad : 0) + (grad == 4 ? 0 : elements * 4) +
                   elements / kShardBlock * 8;  // and the norm's partial sums
  m.workspace = kDeviceWorkspaceBytes;
  return m;
}

}  // namespace engine
