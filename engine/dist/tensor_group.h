// TensorGroup: a tensor-parallel group's communicator as the kernels of tensor-parallel ops see it
// (graph/op.h GroupCollectives): each collective started and waited for at once, since the layer
// after it needs its result.
//
//   TensorGroup group(*tensor_comm);
//   executor.set_tensor_group(&group);
#pragma once

#include "dist/communicator.h"
#include "graph/op.h"

#include <vector>

namespace engine {

class TensorGroup final : public GroupCollectives {
 public:
  explicit TensorGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce(void* data, int64_t count, DType dtype, const std::string& what) override {
    comm_.all_reduce(data, count, dtype, what).wait();
  }
  void all_gather(const void* send, void* recv, int64_t bytes, const std::string& what) override {
    comm_.all_gather(send, recv, bytes, what).wait();
  }
  Communicator& communicator() { return comm_; }

 private:
  Communicator& comm_;
};

}  // namespace engine

namespace engine {

// The whole logical tensor of a tensor-parallel weight from every rank's slice (graph/graph.h
// TensorSlice): a collective of the tensor-parallel group, every rank getting the whole. `local`:
// this rank's values of Param `param`, `count` of them.
std::vector<float> gather_logical(const Param& param, const float* local, int64_t count, Communicator& tensor);

}  // namespace engine
