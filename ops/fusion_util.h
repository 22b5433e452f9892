// What the GPU plan's fusion passes (linalg/linear_gelu.h, nn/add_norm.h) ask of a graph before
// they replace nodes: each value's writers and readers, and whether a node between two positions
// writes a value (which a node moved across them would then read too early or too late).
#pragma once

#include <vector>

#include "graph/graph.h"
#include "graph/op.h"

namespace engine::ops {

// Each value's producing and reading nodes, counted by value.
struct Uses {
  std::vector<int> writers, readers;
  explicit Uses(const Graph& g) : writers(g.values().size()), readers(g.values().size()) {
    for (const Node& n : g.nodes()) {
      for (ValueId v : n.inputs) ++readers[size_t(v)];
      for (ValueId v : n.outputs) ++writers[size_t(v)];
    }
  }
};

inline bool is_activation(const Graph& g, ValueId v) { return g.value(v).placement == Placement::activation; }

// Whether a node strictly between `from` and `to` writes one of `values`.
inline bool writes_between(const std::vector<Node>& nodes, size_t from, size_t to, const std::vector<ValueId>& values) {
  for (size_t n = from + 1; n < to; ++n)
    for (ValueId v : values)
      if (writes(nodes[n], v)) return true;
  return false;
}

}  // namespace engine::ops
