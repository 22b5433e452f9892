// Helpers shared by the op builders and CPU kernels.
#pragma once

#include <string>

#include "core/error.h"
#include "graph/autodiff.h"
#include "graph/graph.h"
#include "graph/op.h"

namespace engine::ops {

// A shape mistake found while the model is built: names the layer and what did not fit. These are
// user errors (a recipe asked for an impossible model), not internal ones.
[[noreturn]] inline void shape_error(const std::string& layer, const std::string& what) {
  throw UserError("layer " + layer + ": " + what);
}

inline double elementwise_flops(const Graph& g, const Node& n) { return double(g.value(n.outputs[0]).shape.numel()); }

// Writes or accumulates v into *out depending on the node's accumulate mode.
inline void store(float* out, float v, bool accumulate) { *out = accumulate ? *out + v : v; }

// A CUDA kernel for nodes of at most `inputs` inputs. The optional input past them (packed
// documents' position ids) has no GPU kernel yet: a node that has it is refused by name (the recipe
// rules refuse data.document_end on a GPU first).
template <Kernel kernel, size_t inputs>
void cuda_without_position_ids(const Node& node, const KernelContext& ctx) {
  if (node.inputs.size() > inputs)
    throw UserError(node.name + ": packed documents (position ids) are not on the GPU yet");
  kernel(node, ctx);
}

}  // namespace engine::ops
