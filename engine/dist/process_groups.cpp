#include "dist/process_groups.h"

#include <unistd.h>

#include <array>
#include <set>
#include <vector>

namespace engine {

ProcessGroups::ProcessGroups(Communicator& world, int tensor_parallel) : world_(world) {
  if (tensor_parallel == 1) {
    tensor_ = make_local_communicator();
    return;
  }
  if (world.size() % tensor_parallel != 0)
    throw UserError("distributed.tensor_parallel " + std::to_string(tensor_parallel) + " does not divide the " +
                    std::to_string(world.size()) + " ranks (world size = tensor_parallel x data-parallel ranks); " +
                    "launch a multiple of " + std::to_string(tensor_parallel) + " ranks");
  const int data_rank = world.rank() / tensor_parallel, tensor_rank = world.rank() % tensor_parallel;
  tensor_ = world.split(data_rank, tensor_rank, "tensor-parallel group");
  data_ = world.split(tensor_rank, data_rank, "data-parallel group");
  // The group's hosts, each rank's name in a fixed-size slot.
  std::array<char, 64> host{};
  gethostname(host.data(), host.size() - 1);
  std::vector<char> hosts(host.size() * size_t(tensor_parallel));
  tensor_->all_gather(host.data(), hosts.data(), int64_t(host.size()), "all-gather of the group's host names").wait();
  std::set<std::string> names;
  for (int r = 0; r < tensor_parallel; ++r) names.insert(std::string(hosts.data() + size_t(r) * host.size()));
  if (names.size() > 1) {
    std::string list;
    for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
    warning_ = "warning: the tensor-parallel group of world rank " + std::to_string(world.rank()) +
               " spans the machines " + list +
               ": its all-reduces (two per layer in each direction) cross the network; place consecutive ranks "
               "on one machine (mpirun --map-by node:PE=... or --rank-by slot)";
  }
}

std::string ProcessGroups::layout() const {
  return std::to_string(tensor_->size()) + " tensor-parallel x " +
         std::to_string(data_ ? data_->size() : world_.size()) + " data-parallel";
}

}  // namespace engine
