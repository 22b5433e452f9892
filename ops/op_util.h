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

}  // namespace engine::ops
