#include "nn/add_norm.h"

#include <algorithm>
#include <vector>

#include "cuda_kernels.h"
#include "elementwise/add.h"
#include "elementwise/widened.h"
#include "fusion_util.h"
#include "nn/layernorm.h"

namespace engine::ops {
namespace {

// The two nodes an add_norm node (inputs a, b, w [, shift]; outputs s, y, mean, rstd) stands for.
Node add_of(const Node& node) {
  return Node{&kAdd, {node.inputs[0], node.inputs[1]}, {node.outputs[0]}, {}, false, false, node.name};
}
Node norm_of(const Node& node) {
  std::vector<ValueId> inputs{node.outputs[0]};
  inputs.insert(inputs.end(), node.inputs.begin() + 2, node.inputs.end());
  const OpDef* norm = node.attrs.ints[0] == 1 ? &kRmsNorm : &kLayerNorm;  // the norm's own attributes
  return Node{norm, inputs, {node.outputs[1], node.outputs[2], node.outputs[3]}, node.attrs, false, false, node.name};
}

// The add, then the norm over its sum.
void add_norm_cpu(const Node& node, const KernelContext& ctx) {
  kAdd.cpu(add_of(node), ctx);
  const Node norm = norm_of(node);
  norm.op->cpu(norm, ctx);
}

double add_norm_flops(const Graph& g, const Node& n) {
  const Node norm = norm_of(n);
  return kAdd.flops(g, add_of(n)) + norm.op->flops(g, norm);
}

bool is_norm(const OpDef* op) { return op == &kLayerNorm || op == &kRmsNorm; }

}  // namespace

const OpDef kAddNorm{.name = "add_norm",
                     .cpu = add_norm_cpu,
                     .cuda = cuda::add_norm,
                     .flops = add_norm_flops,
                     .native_16bit = kWidenedRows,
                     .fp32_outputs = 0b1100,  // outputs 2 and 3: mean and rstd
                     .cuda_16bit = "16-bit rows read and written directly, fp32 arithmetic"};

int fuse_residual_norms(Graph& g) {
  std::vector<Node>& nodes = g.mutable_nodes();
  const Uses uses(g);
  std::vector<bool> erased(nodes.size());
  int fused = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& add = nodes[i];
    if (add.op != &kAdd || add.accumulate) continue;
    const ValueId a = add.inputs[0], b = add.inputs[1], s = add.outputs[0];
    if (!is_activation(g, s) || uses.writers[size_t(s)] != 1) continue;
    const DType type = g.value(s).dtype;
    if (g.value(a).dtype != type || g.value(b).dtype != type) continue;
    // The next node that reads s: the norm, with nothing in between changing a or b.
    size_t j = i + 1;
    while (j < nodes.size() && std::find(nodes[j].inputs.begin(), nodes[j].inputs.end(), s) == nodes[j].inputs.end())
      ++j;
    if (j == nodes.size() || erased[j]) continue;
    const Node& norm = nodes[j];
    if (!is_norm(norm.op) || norm.accumulate || norm.inputs[0] != s || norm.outputs.size() != 3 ||
        g.value(norm.outputs[0]).dtype != type || writes_between(nodes, i, j, {a, b}))
      continue;
    std::vector<ValueId> inputs{a, b};
    inputs.insert(inputs.end(), norm.inputs.begin() + 1, norm.inputs.end());
    nodes[j] = Node{&kAddNorm,  inputs,   {s, norm.outputs[0], norm.outputs[1], norm.outputs[2]},
                    norm.attrs, false,    norm.backward,
                    norm.name,  norm.unit};
    erased[i] = true;
    ++fused;
  }
  g.remove_nodes(erased);
  return fused;
}

}  // namespace engine::ops
