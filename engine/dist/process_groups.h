// ProcessGroups: the world's ranks laid out for tensor and data parallelism. Consecutive ranks form
// a tensor-parallel group (world rank = data rank x T + tensor rank), so that a group shares a
// machine when the launcher places ranks by node, as it does by default; the data-parallel group
// of a rank is the ranks with its tensor rank, and ZeRO shards over it. A tensor-parallel group
// whose ranks run on several machines gets a warning naming the hosts (its all-reduces, one per
// layer in each direction, would cross the network).
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
  ProcessGroups(Communicator& world, int tensor_parallel);
  Communicator& world() { return world_; }
  Communicator& data() { return data_ ? *data_ : world_; }
  Communicator& tensor() { return *tensor_; }
  int tensor_rank() const { return tensor_->rank(); }
  int tensor_size() const { return tensor_->size(); }
  // "" or the warning about a tensor-parallel group spread over machines.
  const std::string& warning() const { return warning_; }
  // "2 tensor-parallel x 2 data-parallel".
  std::string layout() const;

 private:
  Communicator& world_;
  std::unique_ptr<Communicator> data_, tensor_;
  std::string warning_;
};

}  // namespace engine
