// ShardedState: the per-parameter fp32 state of a run (master weights and optimizer state) as
// checkpoint rank files, and back at any world size and ZeRO stage.
//
// Rank r of a world of W writes one file: for each wrap unit and each kind ("master", then the
// optimizer's state tensors), its ShardLayout slice of the unit, fp32, padding included. Every
// stage writes the same slices (at stage 0 each rank holds the whole unit and writes its slice), so
// the ranks write in parallel and no rank gathers. describe_tensors() maps those files to logical
// tensors for the manifest; load_sharded_state() reads, into each rank's optimizer range, the
// pieces it needs from whichever files hold them, checking every file it reads against its checksum.
//
//   auto kinds = state_kinds(store, optimizer);
//   snapshot_rank(store, kinds, image);                             // this rank's file
//   manifest.tensors = describe_tensors(graph, world, names(kinds));
//   load_sharded_state(dir, manifest, store, kinds);                // another world size, stage
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "optim/optimizer.h"
#include "runtime/parameters.h"

namespace engine {

// One kind of per-parameter state: its per-unit fp32 buffers over the optimizer range.
struct StateKind {
  std::string name;
  std::vector<float*> units;
};
std::vector<StateKind> state_kinds(const ParameterStore& store, Optimizer& optimizer);

std::string rank_file_name(int rank);  // rank-00000.bin
int64_t rank_file_bytes(const Graph& graph, int world, size_t kinds);

// This rank's file image (what the checkpoint memory plan accounts for), into `image` (resized).
void snapshot_rank(const ParameterStore& store, const std::vector<StateKind>& kinds, std::vector<std::byte>& image);

std::vector<CheckpointTensor> describe_tensors(const Graph& graph, int world, const std::vector<std::string>& kinds);

// Fills every kind's optimizer range from the checkpoint; throws UserError for a missing tensor, a
// shape that differs, a file of the wrong size or a checksum that does not match.
void load_sharded_state(const std::filesystem::path& dir, const Manifest& manifest, const ParameterStore& store,
                        const std::vector<StateKind>& kinds);

}  // namespace engine
