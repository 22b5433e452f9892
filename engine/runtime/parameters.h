// ParameterStore: the model's parameters and gradients, one flat fp32 buffer per wrap unit each,
// laid out as the graph's Param offsets say. Units are what ZeRO-3 will gather and offload will move.
//
//   ParameterStore store(graph);
//   store.initialize(graph, seed);      // GPT-2 style: normal(std) weights, zero biases, unit norms
//   float* w = store.param(index);      // Param `index` of graph.params()
//
// In 16-bit precision the graph's parameter values are bf16/f16: the store then also holds a
// 16-bit copy of every unit, which the kernels read and refresh_copies() rounds from the fp32
// masters after each update. Gradient values of a 16-bit type (precision.accumulation_dtype)
// accumulate in 16-bit buffers that widen_gradients() turns into the fp32 ones the optimizer reads.
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

  float* param(int index) const;  // the fp32 master
  float* grad(int index) const;   // the fp32 gradient the optimizer reads
  // What the graph's parameter and gradient values point at: the 16-bit copies when they are 16-bit.
  void* param_storage(int index) const;
  void* grad_storage(int index) const;
  DType param_dtype() const { return param_dtype_; }
  DType grad_dtype() const { return grad_dtype_; }
  // Rounds the fp32 masters into the 16-bit copies (after initialisation, loading and each update).
  void refresh_copies();
  // Widens 16-bit accumulated gradients into the fp32 ones (before clipping and the update).
  void widen_gradients();
  // Follows a change of the graph's 16-bit type (fp16 -> bf16 fallback): same sizes, new rounding.
  void retype(DType from, DType to);
  // Bytes of the 16-bit parameter copies and gradient buffers (0 in fp32).
  int64_t copy_bytes() const;
  int64_t numel(int index) const { return graph_.value(graph_.params()[size_t(index)].value).shape.numel(); }
  const Graph& graph() const { return graph_; }
  std::vector<Buffer>& param_units() { return params_; }
  std::vector<Buffer>& grad_units() { return grads_; }

 private:
  const Graph& graph_;
  std::vector<Buffer> params_;
  std::vector<Buffer> grads_;
  DType param_dtype_ = DType::f32, grad_dtype_ = DType::f32;
  std::vector<Buffer> params16_, grads16_;  // empty in fp32
};

}  // namespace engine
