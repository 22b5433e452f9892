// OffloadSpec: where a rank's offloaded state lives and how it moves, as the planner and the
// offload stores see it (built from the recipe's offload section; the tiers are core/offload_tier.h's).
//
//   OffloadSpec spec{.optimizer = OffloadTier::nvme, .directory = "/scratch/swap", .file_stem = "run-rank-00000"};
//   if (spec.masters_offloaded(DType::bf16, /*stage=*/1)) ...  // the fp32 masters go with the optimizer state
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "core/dtype.h"
#include "core/offload_tier.h"

namespace engine {

struct OffloadSpec {
  OffloadTier optimizer = OffloadTier::none;   // fp32 masters (where separate) and optimizer state
  OffloadTier parameters = OffloadTier::none;  // stage 3: the parameter shard the gathers read
  std::filesystem::path directory;             // nvme: the swap directory
  std::string file_stem = "engine";            // swap files are <directory>/<file_stem>.<what>.swap
  int queue_depth = 8;
  int64_t block_size = int64_t(1) << 20;
  int64_t chunk_size = int64_t(1) << 20;  // elements per chunk of the streamed optimizer step

  bool any() const { return optimizer != OffloadTier::none || parameters != OffloadTier::none; }
  // The fp32 masters are separate from the parameters (16-bit compute, or stage 3's shard) and so
  // move with the optimizer state; in fp32 below stage 3 they are the parameters and stay.
  bool masters_offloaded(DType compute, int stage) const {
    return optimizer != OffloadTier::none && (compute != DType::f32 || stage == 3);
  }
};

// Chunks of the streamed step held in host memory at once: one being updated while the next is read
// and the previous one written back, so the disk always has work.
inline constexpr int kChunkSlots = 3;

}  // namespace engine
