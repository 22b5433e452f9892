#include "dist/process_groups.h"

#include <unistd.h>

#include <array>
#include <set>
#include <vector>

namespace engine {

ProcessGroups::ProcessGroups(Communicator& world, int tensor_parallel, int pipeline_parallel)
    : world_(world), stages_(pipeline_parallel) {
  const int model_ranks = tensor_parallel * pipeline_parallel;
  if (model_ranks == 1) {
    tensor_ = make_local_communicator();
    return;
  }
  if (world.size() % model_ranks != 0)
    throw UserError("distributed.tensor_parallel x pipeline_parallel " + std::to_string(model_ranks) +
                    " does not divide the " + std::to_string(world.size()) +
                    " ranks (world size = tensor_parallel x pipeline_parallel x data-parallel ranks); launch a "
                    "multiple of " +
                    std::to_string(model_ranks) + " ranks");
  const int tensor_rank = world.rank() % tensor_parallel, stage = world.rank() / tensor_parallel % pipeline_parallel;
  const int data_rank = world.rank() / model_ranks, line = data_rank * tensor_parallel + tensor_rank;
  stage_ = stage;
  tensor_ = world.split(data_rank * pipeline_parallel + stage, tensor_rank, "tensor-parallel group");
  data_ = world.split(stage * tensor_parallel + tensor_rank, data_rank, "data-parallel group");
  if (pipeline_parallel > 1) {
    const int lines = world.size() / pipeline_parallel;
    pipeline_ = world.split(line, stage, "pipeline group");
    // Pairs of neighbouring stages: (0, 1), (2, 3), ... in one split, (1, 2), (3, 4), ... in the other;
    // a stage without a partner in a split is a group alone there.
    const int even = stage % 2 == 0 ? stage : stage - 1, odd = stage % 2 == 1 ? stage : stage - 1;
    even_pairs_ = world.split(line * (pipeline_parallel + 1) + even + 1, stage, "pipeline stage pair");
    odd_pairs_ = world.split(line * (pipeline_parallel + 1) + odd + 1, stage, "pipeline stage pair");
    Communicator* with_next = stage % 2 == 0 ? even_pairs_.get() : odd_pairs_.get();
    Communicator* with_previous = stage % 2 == 1 ? even_pairs_.get() : odd_pairs_.get();
    if (stage + 1 < pipeline_parallel) next_ = with_next;
    if (stage > 0) previous_ = with_previous;
    const bool end = stage == 0 || stage == pipeline_parallel - 1;
    ends_ = world.split(end ? line : lines + world.rank(), stage, "first and last pipeline stage");
    if (end) embedding_ = ends_.get();
  }
  if (tensor_parallel == 1) return;
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
  return std::to_string(tensor_->size()) + " tensor-parallel x " + std::to_string(stages_) + " pipeline stages x " +
         std::to_string(data_ ? data_->size() : world_.size()) + " data-parallel";
}

}  // namespace engine
