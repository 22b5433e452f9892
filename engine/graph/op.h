// OpDef: what the graph knows about an operation: its name, its CPU kernel, its gradient rule and
// its FLOP count. Each op's header in ops/ declares a builder function that checks shapes and
// appends a node; the kernels read and write through a KernelContext.
//
//   // ops/nn/gelu.h
//   ValueId gelu(Graph& g, ValueId x, const std::string& name);
//   extern const OpDef kGelu, kGeluBackward;
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "graph/graph.h"

namespace engine {

class GradBuilder;

// Where a kernel finds its values during a step, plus the step's identity for random streams.
struct KernelContext {
  const Graph* graph = nullptr;
  std::vector<void*> pointers;  // indexed by ValueId
  uint64_t seed = 0;
  uint64_t step = 0;        // optimizer step
  uint64_t micro_step = 0;  // micro-batch within the step
  bool training = true;     // false for evaluation and generation: dropout passes values through

  float* f32(ValueId id) const { return static_cast<float*>(pointers[static_cast<size_t>(id)]); }
  const int32_t* i32(ValueId id) const { return static_cast<const int32_t*>(pointers[static_cast<size_t>(id)]); }
  const Shape& shape(ValueId id) const { return graph->value(id).shape; }
  // A value as a tensor view (host memory: the CPU executor runs these kernels).
  Tensor tensor(ValueId id) const {
    const Value& v = graph->value(id);
    return Tensor{pointers[static_cast<size_t>(id)], v.shape, v.dtype, Device{}};
  }
  // Whether output `index` of `node` is added to (gradients) rather than overwritten.
  bool accumulates(const Node& node, size_t index) const {
    return node.accumulate || graph->value(node.outputs[index]).placement == Placement::gradient;
  }
};

// The kernel of every op whose output is its f32 input, element for element: output (+)= input.
// Used by autodiff's gradient accumulation, reshape and dropout in evaluation.
void copy_kernel(const Node& node, const KernelContext& ctx);

struct OpDef {
  const char* name;
  void (*cpu)(const Node& node, const KernelContext& ctx);
  // Appends the backward nodes of `node`; nullptr when no gradient flows through the op.
  void (*grad)(GradBuilder& builder, const Node& node) = nullptr;
  // Floating-point operations of one execution (a multiply-add counts 2).
  double (*flops)(const Graph& graph, const Node& node) = nullptr;
};

}  // namespace engine
