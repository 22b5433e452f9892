#include "trainer/device.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <map>
#include <vector>

#include "core/build_flags.h"
#include "core/device_info.h"
#include "core/error.h"
#include "dist/nccl_communicator.h"
#include "dist/staged_communicator.h"
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

bool device_resident(const recipe::Recipe& recipe, std::string* why) {
  std::string reason;
  if (recipe.offload.optimizer != OffloadTier::none || recipe.offload.parameters != OffloadTier::none)
    reason = std::string("offload.") + (recipe.offload.optimizer != OffloadTier::none ? "optimizer" : "parameters");
  if (why) *why = reason;
  return reason.empty();
}

bool uses_device_collectives(const recipe::Recipe& recipe, int world) {
  return device_resident(recipe) &&
         (world > 1 || recipe.distributed.gpu_collectives != recipe::GpuCollectives::auto_detect);
}

namespace {

// Two ranks of `host` that share a GPU (the same machine and PCI bus id), as "ranks 0 and 1 share
// GPU 0000:19:00.0 on node-3", or "": every rank gathers every rank's, so all agree (a collective).
std::string shared_gpu(Communicator& host, Device device) {
  constexpr size_t kKey = 256;
  char machine[kKey / 2] = {};
  gethostname(machine, sizeof machine - 1);
  std::array<char, kKey> key{};
  // The boot id tells apart machines that share a host name (containers): "<host>/<boot id> <bus id>".
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  const std::string mine = std::string(machine) + "/" + boot + " " + cuda_device_pci_bus_id(device.index);
  std::copy_n(mine.begin(), std::min(mine.size(), kKey - 1), key.begin());
  std::vector<char> all(kKey * size_t(host.size()));
  host.all_gather(key.data(), all.data(), int64_t(kKey), "each rank's GPU").wait();
  std::map<std::string, int> first;
  for (int r = 0; r < host.size(); ++r) {
    const std::string gpu(all.data() + size_t(r) * kKey);
    const auto [at, inserted] = first.emplace(gpu, r);
    if (inserted) continue;
    const size_t space = gpu.rfind(' ');
    return "ranks " + std::to_string(at->second) + " and " + std::to_string(r) + " share GPU " + gpu.substr(space + 1) +
           " on " + gpu.substr(0, gpu.find('/'));
  }
  return "";
}

}  // namespace

std::unique_ptr<Communicator> make_device_collectives(const recipe::Recipe& recipe, Communicator& host, Device device,
                                                      std::string* how) {
  if (device.kind != Device::Kind::cuda || !uses_device_collectives(recipe, host.size())) return nullptr;
  const std::string sharing = shared_gpu(host, device);
  const bool own_gpus = sharing.empty();  // every rank has a GPU of its own
  bool nccl = false;
  switch (recipe.distributed.gpu_collectives) {
    case recipe::GpuCollectives::auto_detect:
      nccl = kHaveNccl && own_gpus;
      break;
    case recipe::GpuCollectives::nccl:
      if (!own_gpus)
        throw UserError("distributed.gpu_collectives: nccl, but " + sharing +
                        ", and NCCL refuses two ranks on one GPU: use staged (or auto, which picks it)");
      nccl = true;  // a build without NCCL says so
      break;
    case recipe::GpuCollectives::staged:
      break;
  }
  if (how)
    *how = nccl ? "NCCL on the GPUs"
                : "page-locked host memory over " + host.backend() + (own_gpus ? "" : " (" + sharing + ")");
  if (nccl)
    return make_nccl_communicator(host, device.index,
                                  CommunicatorOptions{.timeout_seconds = recipe.distributed.timeout});
  return make_staged_communicator(host, make_cuda_copies(device.index));
}

std::string describe_device(Device device) {
  if (device.kind == Device::Kind::cpu) return "cpu";
  return "cuda:" + std::to_string(device.index) + " (" + cuda_device_name(device.index) + ")";
}

DeviceMemoryPlan plan_device_memory(const CompiledStep& step, const recipe::Recipe& recipe, int world) {
  const Graph& g = step.model.graph;
  const ShardLayout layout(g.units(), world, 0);  // the store's: each unit padded for the ranks
  int64_t elements = 0;
  for (size_t u = 0; u < layout.units(); ++u) elements += layout.padded(u);
  const auto param = int64_t(dtype_size(g.param_dtype())), grad = int64_t(dtype_size(g.grad_dtype()));
  DeviceMemoryPlan m;
  m.activations = std::max(step.train.arena_bytes, step.eval.arena_bytes);
  m.casts = std::max(cuda_scratch_bytes(g, step.train), cuda_scratch_bytes(g, step.eval));
  m.inputs = step.memory.inputs;
  m.workspace = kDeviceWorkspaceBytes;
  const int stage = recipe.distributed.zero_stage;
  m.gradients = stage < 2 ? elements * grad : 0;  // stages 2-3 write them into arena buffers
  if (!device_resident(recipe)) {
    m.parameters = stage < 3 ? elements * param : 0;  // stage 3 gathers each unit into the arena
    return m;
  }
  // The optimizer's range of each unit: the whole unit, or this rank's shard (stages 1-3 on several
  // ranks).
  int64_t range = 0, blocks = 0;  // blocks: the norm's partial sums, one process's list (value blocks)
  for (size_t u = 0; u < layout.units(); ++u) {
    range += ParameterStore::range_size(layout, step.sharding, u);
    blocks += layout.value_blocks(u);
  }
  const bool sharded = range != elements;
  // ZeRO-3 holds the parameters' shard (in fp32 the masters themselves) and gathers each unit into
  // the arena.
  m.parameters = stage < 3 ? elements * param : (param == 4 ? 0 : range * param);
  m.masters = param == 4 && stage < 3 ? 0 : range * 4;
  m.optimizer_state = int64_t(optimizer_state_tensors(recipe.optimizer)) * range * 4;
  // The update reads the step's sum in the gradient type (a 16-bit run's fp32 gradients exist only
  // for a hook that reads them before the update: optim/device_optimizer.h).
  const bool reduced = uses_device_collectives(recipe, world);  // the sum is where the ranks' reductions land
  m.gradient_sum = (step.sharding.accumulation > 1 || reduced || stage >= 2 ? range * grad : 0) +
                   (blocks + norm_chunks(blocks)) * 8;  // and the norm's partial sums, and their chunks' sums
  if (sharded)  // the shard's partial sums, and every rank's gathered (padding included)
    m.gradient_sum += (range + elements) / kShardBlock * 8;
  if (reduced) {  // NCCL's reduce-scatter receives a unit's chunks from every rank (world x shard)
    int64_t largest = 0;
    for (size_t u = 0; u < layout.units(); ++u) largest = std::max(largest, layout.padded(u));
    m.reduce_staging = largest * grad;
  }
  return m;
}

}  // namespace engine
