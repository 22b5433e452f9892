#include "trainer/device.h"

#include "core/build_flags.h"
#include "core/device_info.h"
#include "core/error.h"
#include "optim/update_math.h"
#include "runtime/device_runner.h"
#include "trainer/session.h"

namespace engine {

Device resolve_device(const recipe::Recipe& recipe, int local_rank) {
  const int devices = cuda_device_count();
  const Device cuda{Device::Kind::cuda, devices > 0 ? local_rank % devices : 0};
  switch (recipe.run.device) {
    case recipe::RunDevice::cpu:
      return Device{};
    case recipe::RunDevice::cuda:
      if (devices == 0)
        throw UserError(
            std::string("run.device: cuda, but ") +
            (kHaveCuda ? "no CUDA device is present on this machine" : "this engine was built without CUDA") +
            "; use run.device: cpu or auto");
      return cuda;
    case recipe::RunDevice::auto_detect:
      if (devices > 0 && recipe.data.document_end)
        throw UserError(
            "run.device: auto picks the GPU here, where packed documents (data.document_end) do not run yet: "
            "set run.device: cpu, or leave data.document_end out");
      if (devices > 0 && recipe.lora.rank > 0)
        throw UserError(
            "run.device: auto picks the GPU here, where LoRA (lora.rank) does not run yet: set run.device: cpu, "
            "or lora.rank: 0");
      return devices == 0 ? Device{} : cuda;
  }
  return Device{};
}

bool planned_for_cuda(const recipe::Recipe& recipe) {
  return recipe.run.device == recipe::RunDevice::cuda ||
         (recipe.run.device == recipe::RunDevice::auto_detect && cuda_device_count() > 0);
}

bool device_resident(const recipe::Recipe& recipe, int world, std::string* why) {
  std::string reason;
  if (world > 1)
    reason = std::to_string(world) + " ranks";
  else if (recipe.distributed.zero_stage >= 2)
    reason = "zero_stage " + std::to_string(recipe.distributed.zero_stage);
  else if (recipe.offload.optimizer != OffloadTier::none || recipe.offload.parameters != OffloadTier::none)
    reason = "offload";
  if (why) *why = reason;
  return reason.empty();
}

std::string describe_device(Device device) {
  if (device.kind == Device::Kind::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index) + " (" + cuda_device_name(device.index) + ")";
}

DeviceMemoryPlan plan_device_memory(const CompiledStep& step, const recipe::Recipe& recipe, int world) {
  const Graph& g = step.model.graph;
  const ShardLayout layout(g.units(), 1, 0);
  int64_t elements = 0;
  for (size_t u = 0; u < layout.units(); ++u) elements += layout.padded(u);
  const auto param = int64_t(dtype_size(g.param_dtype())), grad = int64_t(dtype_size(g.grad_dtype()));
  DeviceMemoryPlan m;
  m.activations = std::max(step.train.arena_bytes, step.eval.arena_bytes);
  m.casts = std::max(cuda_scratch_bytes(g, step.train), cuda_scratch_bytes(g, step.eval));
  m.inputs = step.memory.inputs;
  m.workspace = kDeviceWorkspaceBytes;
  const int stage = recipe.distributed.zero_stage;
  if (!device_resident(recipe, world)) {
    m.parameters = stage < 3 ? elements * param : 0;  // stage 3 gathers each unit into the arena
    m.gradients = stage < 2 ? elements * grad : 0;    // stages 2-3 write them into arena buffers
    return m;
  }
  m.parameters = elements * param;
  m.gradients = elements * grad;
  m.masters = param == 4 ? 0 : elements * 4;
  m.optimizer_state = int64_t(optimizer_state_tensors(recipe.optimizer)) * elements * 4;
  // The update reads the step's sum in the gradient type (a 16-bit run's fp32 gradients exist only
  // for a hook that reads them before the update: optim/device_optimizer.h).
  const int64_t blocks = elements / kShardBlock;
  m.gradient_sum = (step.sharding.accumulation > 1 ? elements * grad : 0) +
                   (blocks + norm_chunks(blocks)) * 8;  // and the norm's partial sums, and their chunks' sums
  return m;
}

}  // namespace engine
