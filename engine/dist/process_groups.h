// ProcessGroups: the world's ranks laid out for tensor, pipeline and data parallelism:
//   world rank = (data rank x P + stage) x T + tensor rank
// Consecutive ranks form a tensor-parallel group, so that a group shares a machine when the launcher
// places ranks by node, as it does by default (a group spread over machines gets a warning naming
// the hosts: its all-reduces, two per layer in each direction, would cross the network). The
// data-parallel group of a rank is the ranks with its stage and tensor rank (ZeRO shards over it);
// its pipeline group the ranks with its data and tensor rank, one per stage. Neighbouring stages talk
// through a group of the two (previous() and next()), and the first and last stage through one more
// (embedding(): a tied embedding's gradients).
//
//   ProcessGroups groups(world, /*tensor_parallel=*/2);
//   Session session(recipe, compile_step(recipe, groups.data().size(), groups.tensor_rank()),
//                   &groups.data(), &groups.tensor());
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace engine {

class ProcessGroups {
 public:
  // A collective over `world` when tensor_parallel > 1 (the splits); a UserError when the world size
  // is not a multiple of tensor_parallel.
  ProcessGroups(Communicator& world, int tensor_parallel, int pipeline_parallel = 1);
  Communicator& world() { return world_; }
  Communicator& data() { return data_ ? *data_ : world_; }
  Communicator& tensor() { return *tensor_; }
  int tensor_rank() const { return tensor_->rank(); }
  int tensor_size() const { return tensor_->size(); }
  // Pipeline parallelism: this rank's stage of `stages()`, its pipeline group, the groups of it and
  // the stage before (null on the first) and after (null on the last), rank 0 the earlier stage; and
  // the first and last stage's group (null on the others, and with one stage).
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  Communicator* pipeline() { return pipeline_.get(); }
  Communicator* previous() { return previous_; }
  Communicator* next() { return next_; }
  Communicator* embedding() { return embedding_; }
  // "" or the warning about a tensor-parallel group spread over machines.
  const std::string& warning() const { return warning_; }
  // "2 tensor-parallel x 2 data-parallel".
  std::string layout() const;

 private:
  Communicator& world_;
  std::unique_ptr<Communicator> data_, tensor_, pipeline_, even_pairs_, odd_pairs_, ends_;
  Communicator *previous_ = nullptr, *next_ = nullptr, *embedding_ = nullptr;
  int stage_ = 0, stages_ = 1;
  std::string warning_;
};

}  // namespace engine
