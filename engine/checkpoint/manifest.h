// Manifest: the one file that makes a checkpoint directory a checkpoint. It is written last, so a
// directory without a readable manifest is an unfinished write and never trusted.
//
// It maps every logical tensor (a parameter's fp32 master weights, or one of its optimizer states)
// to its pieces in the rank files: which file, the byte offset there, and which elements of the
// tensor (row-major, fp32) the piece holds. Any world size and ZeRO stage can read any layout
// through it. It also carries each rank file's size and XXH3-64 checksum, the training state
// (counters, loss scale, data position, plugin state) and the resolved recipe.
//
//   Manifest m = read_manifest(dir);                  // UserError naming what is wrong
//   const CheckpointTensor* t = m.find("h.0.attn.qkv.weight", "exp_avg");
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace engine {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointPiece {
  int file = 0;        // index into Manifest::files
  int64_t offset = 0;  // bytes from the start of the file
  int64_t first = 0;   // the tensor's first element in this piece
  int64_t count = 0;   // elements
  // 0: elements [first, first + count) of the tensor. Else a box (a tensor-parallel slice's rows):
  // count / width rows of `width` columns of the tensor viewed as (shape[0], the rest), starting at
  // element `first`, row after row.
  int64_t width = 0;
};

struct CheckpointTensor {
  std::string name;  // the engine's parameter name
  std::string kind;  // "master", or an optimizer state: "exp_avg", "exp_avg_sq", "momentum_buffer"
  std::vector<int64_t> shape;
  std::vector<CheckpointPiece> pieces;  // in element order, covering the tensor once
  int64_t numel() const;
};

struct CheckpointFile {
  std::string name;  // relative to the checkpoint directory
  int64_t bytes = 0;
  std::string xxh3;  // 16 hex digits
};

struct Manifest {
  int64_t step = 0;           // optimizer steps completed
  int world_size = 1;         // rank files: data-parallel ranks x tensor_parallel
  int tensor_parallel = 1;    // rank file d x T + t holds tensor rank t's slices of data rank d's shard
  int pipeline_parallel = 1;  // stages: rank file (d x P + s) x T + t holds stage s's weights
  int zero_stage = 0;
  std::string engine_version;
  std::string created;   // UTC, ISO 8601
  nlohmann::json state;  // TrainingState (checkpoint/training_state.h)
  std::string recipe;    // the resolved recipe, YAML
  std::vector<CheckpointFile> files;
  std::vector<CheckpointTensor> tensors;

  const CheckpointTensor* find(const std::string& name, const std::string& kind) const;
  int64_t total_bytes() const;
};

nlohmann::json manifest_to_json(const Manifest& manifest);
// Throws UserError naming `dir` and what is missing or malformed.
Manifest read_manifest(const std::filesystem::path& dir);

}  // namespace engine
