// ParameterStore: the model's parameters and gradients, one flat fp32 buffer per wrap unit each,
// laid out as the graph's Param offsets say. Units are what ZeRO-3 will gather and offload will move.
//
//   ParameterStore store(graph);
//   store.initialize(graph, seed);      // GPT-2 style: normal(std) weights, zero biases, unit norms
//   float* w = store.param(index);      // Param `index` of graph.params()
#pragma once

#include <cstdint>
#include <vector>

#include "graph/graph.h"
#include "runtime/buffer.h"

namespace engine {

class ParameterStore {
 public:
  explicit ParameterStore(const Graph& graph);

  // Fills every parameter from its ParamInit, drawing normals in parameter order from the seed's
  // init stream: the same seed gives the same model.
  void initialize(uint64_t seed);
  void zero_grads();

  float* param(int index) const;
  float* grad(int index) const;
  int64_t numel(int index) const { return graph_.value(graph_.params()[size_t(index)].value).shape.numel(); }
  const Graph& graph() const { return graph_; }
  std::vector<Buffer>& param_units() { return params_; }
  std::vector<Buffer>& grad_units() { return grads_; }

 private:
  const Graph& graph_;
  std::vector<Buffer> params_;
  std::vector<Buffer> grads_;
};

}  // namespace engine
