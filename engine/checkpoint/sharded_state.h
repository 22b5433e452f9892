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
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "optim/optimizer.h"
#include "runtime/parameters.h"

namespace engine {

// One kind of per-parameter state over each unit's optimizer range: per-unit fp32 buffers in
// memory, or kind `offloaded_kind` of an OffloadedState (read and written in pieces, never staged).
struct StateKind {
  std::string name;
  std::vector<float*> units;
  class OffloadedState* offloaded = nullptr;
  size_t offloaded_kind = 0;

  void read(size_t unit, int64_t first, int64_t count, float* out) const;
  void write(size_t unit, int64_t first, int64_t count, const float* in) const;
};
std::vector<StateKind> state_kinds(const ParameterStore& store, Optimizer& optimizer);

std::string rank_file_name(int rank);  // rank-00000.bin
int64_t rank_file_bytes(const Graph& graph, int world, size_t kinds);

// This rank's file image (what the checkpoint memory plan accounts for), into `image` (resized).
void snapshot_rank(const ParameterStore& store, const std::vector<StateKind>& kinds, std::vector<std::byte>& image);
// The same bytes in order, handed to `sink` a piece at a time (offloaded state: read from where it
// lives through one bounded buffer).
inline constexpr int64_t kStreamPieceElements = int64_t(1) << 20;  // stream_rank's buffer of offloaded state
void stream_rank(const ParameterStore& store, const std::vector<StateKind>& kinds,
                 const std::function<void(const std::byte*, size_t)>& sink);

// `world`: data-parallel ranks; with tensor_parallel T, the graph is tensor rank 0's; with pipeline
// stages, it is stage `stage`'s. The files are the world's: (data rank x stages + stage) x T + tensor
// rank (Manifest::tensor_parallel, pipeline_parallel).
std::vector<CheckpointTensor> describe_tensors(const Graph& graph, int world, const std::vector<std::string>& kinds,
                                               int tensor_parallel = 1, int stages = 1, int stage = 0);

// Fills every kind's optimizer range from the checkpoint; throws UserError for a missing tensor, a
// shape that differs, a file of the wrong size or a checksum that does not match.
void load_sharded_state(const std::filesystem::path& dir, const Manifest& manifest, const ParameterStore& store,
                        const std::vector<StateKind>& kinds);

}  // namespace engine
