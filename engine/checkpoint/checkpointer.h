// Checkpointer: writes a run's checkpoints during `engine train` and commits them atomically.
//
// A checkpoint is the directory <dir>/step-<N>. Every rank writes its rank file into
// <dir>/.tmp-step-<N> and fsyncs it; once every rank reports its file durable, rank 0 writes the
// manifest (with every file's size and checksum) into the temporary directory, fsyncs it and
// renames the directory to step-<N>. A crash, a kill -9 or a full disk at any byte leaves at most a
// .tmp- directory that nothing trusts (and the next write removes); the previous checkpoints are
// never touched until a newer one is committed, and then only the oldest beyond keep_last go.
//
// With `async`, the rank file is written from a snapshot on a background thread while training
// continues; the ranks agree at each step end (one small collective, only while a write is in
// flight) whether every file is durable, and commit then. A new checkpoint waits for the previous.
//
//   Checkpointer checkpoints(recipe.checkpoint, dir, comm);
//   checkpoints.start(manifest, [&](auto& image) { snapshot_rank(store, kinds, image); });
//   for each step end:  if (auto done = checkpoints.settle(false)) note(done->path);
//   checkpoints.settle(true);                                         // before exiting
#pragma once

#include <atomic>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/manifest.h"
#include "dist/communicator.h"
#include "recipe/recipe.h"
#include "telemetry/trace.h"

namespace engine {

// The checkpoint directory of a run: checkpoint.dir, or <run dir>/checkpoints.
std::filesystem::path checkpoint_directory(const recipe::Recipe& r);
// N for a directory named `prefix`N (step-N, .tmp-step-N), else none.
std::optional<int64_t> checkpoint_step_in_name(const std::string& name, const std::string& prefix = "step-");
// Committed checkpoints in `dir` (step-N with a manifest), oldest first.
std::vector<std::filesystem::path> committed_checkpoints(const std::filesystem::path& dir);

class Checkpointer {
 public:
  // `comm`: every rank that writes a file (the world, tensor-parallel ranks included).
  Checkpointer(const recipe::CheckpointSection& config, std::filesystem::path dir, Communicator& comm);
  ~Checkpointer();  // waits for a write in flight, which stays uncommitted
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Every rank, at the same step: settles the previous checkpoint, has `snapshot` fill this rank's
  // file image (a buffer kept between checkpoints: no allocation, no page faults after the first),
  // and starts writing it as checkpoint `manifest.step`. `manifest` needs no files: they are added.
  void start(Manifest manifest, const std::function<void(std::vector<std::byte>&)>& snapshot);
  // The same for state that must not be staged in memory (offloaded to a swap file) or need not be
  // (checkpoint.async false: no snapshot held): `produce` hands the rank file's bytes to its sink
  // in order, and the write is synchronous (the state changes at the next step).
  using Sink = std::function<void(const std::byte*, size_t)>;
  void start_streamed(Manifest manifest, const std::function<void(const Sink&)>& produce);
  bool in_flight() const { return writer_.joinable() || pending_; }

  struct Committed {
    int64_t step = 0;
    std::filesystem::path path;
    int64_t bytes = 0;         // all ranks' files
    double seconds = 0;        // from start() to the commit
    double write_seconds = 0;  // the slowest rank's write and fsync
  };
  // Every rank, at the same points, while in_flight(): commits the checkpoint in flight once every
  // rank's file is durable (with `wait`, after waiting for this rank's). Returns what was committed;
  // throws CheckpointIoError (on_error: stop) or warns (continue) when a rank could not write.
  std::optional<Committed> settle(bool wait);
  // Seconds the last committed checkpoint took to write, or none yet (for the preemption budget).
  std::optional<double> last_write_seconds() const { return last_write_seconds_; }
  const std::filesystem::path& directory() const { return dir_; }

 private:
  void write_rank_file(trace::Lane lane);  // on the step's thread or the writer's
  void begin(Manifest manifest);
  void commit(Committed& done);
  void prune();

  recipe::CheckpointSection config_;
  std::filesystem::path dir_;
  Communicator& comm_;
  std::thread writer_;
  bool pending_ = false;
  Manifest manifest_;
  std::vector<std::byte> image_;
  std::function<void(const Sink&)> produce_;  // set for a streamed write
  std::filesystem::path tmp_;
  double started_ = 0;
  // What the writer thread reports: 0 writing, 1 durable, -1 failed (error_ says why).
  std::atomic<int> status_{0};
  std::string error_;
  double write_seconds_ = 0;
  int64_t file_bytes_ = 0;  // this rank's file (pipeline stages differ)
  uint64_t checksum_ = 0;
  std::optional<double> last_write_seconds_;
};

}  // namespace engine
