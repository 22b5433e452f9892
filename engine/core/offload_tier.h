// OffloadTier: where a kind of offloaded state lives, as the recipe's offload.optimizer and
// offload.parameters name it and as the planner and the offload stores use it.
//
//   none  in the memory the step computes in, as without offload
//   cpu   host memory, through the offload path (chunked updates, fetched shards)
//   nvme  a swap file, streamed through host memory
#pragma once

namespace engine {

enum class OffloadTier { none, cpu, nvme };

// The tier's name in a recipe: "none", "cpu" or "nvme".
inline const char* offload_tier_name(OffloadTier tier) {
  return tier == OffloadTier::nvme ? "nvme" : tier == OffloadTier::cpu ? "cpu" : "none";
}

}  // namespace engine
