#include "linalg/linear_gelu.h"

#include <vector>

#include "cuda_kernels.h"
#include "fusion_util.h"
#include "linalg/gemm16.h"
#include "linalg/linear.h"
#include "nn/activation.h"

namespace engine::ops {

namespace {

// inputs x, W, b; outputs a, f: the linear kernel, then the GELU kernel.
void linear_gelu_cpu(const Node& node, const KernelContext& ctx) {
  kLinear.cpu(Node{&kLinear, node.inputs, {node.outputs[0]}, {}, false, node.backward, node.name}, ctx);
  kGelu.cpu(Node{&kGelu, {node.outputs[0]}, {node.outputs[1]}, {}, false, node.backward, node.name}, ctx);
}

// inputs dy, W2, a; output da: the input gradient's product into da, then GELU's backward over it
// in place.
void linear_backward_input_gelu_cpu(const Node& node, const KernelContext& ctx) {
  const ValueId a = node.inputs[2], da = node.outputs[0];
  kLinearBackwardInput.cpu(
      Node{&kLinearBackwardInput, {node.inputs[0], node.inputs[1]}, {da}, {}, false, true, node.name}, ctx);
  kGeluBackward.cpu(Node{&kGeluBackward, {a, da}, {da}, {}, false, true, node.name}, ctx);
}

double linear_gelu_flops(const Graph& g, const Node& n) {
  const Node product{&kLinear, n.inputs, {n.outputs[0]}, {}, false, false, n.name};
  return kLinear.flops(g, product) + elementwise_flops(g, n);
}

double linear_backward_input_gelu_flops(const Graph& g, const Node& n) {
  const Node product{&kLinearBackwardInput, {n.inputs[0], n.inputs[1]}, {n.outputs[0]}, {}, false, true, n.name};
  return kLinearBackwardInput.flops(g, product) + elementwise_flops(g, n);
}

constexpr const char* kMatmulGelu16 = "16-bit matmul (oneDNN), fp32 accumulation, then GELU";
constexpr const char* kCublasGelu16 = "16-bit cuBLASLt matmul, fp32 accumulation, GELU in its epilogue";

}  // namespace

const OpDef kLinearGelu{.name = "linear_gelu",
                        .cpu = linear_gelu_cpu,
                        .cuda = cuda::linear_gelu,
                        .flops = linear_gelu_flops,
                        .native_16bit = kMatmulGelu16,
                        .native_for = matmul_16bit_available,
                        .cuda_16bit = kCublasGelu16,
                        .matmul = true};
const OpDef kLinearBackwardInputGelu{.name = "linear_backward_input_gelu",
                                     .cpu = linear_backward_input_gelu_cpu,
                                     .cuda = cuda::linear_backward_input_gelu,
                                     .flops = linear_backward_input_gelu_flops,
                                     .native_16bit = kMatmulGelu16,
                                     .native_for = matmul_16bit_available,
                                     .cuda_16bit = kCublasGelu16,
                                     .matmul = true};

GeluFusions fuse_linear_gelu(Graph& g) {
  GeluFusions fused;
  std::vector<Node>& nodes = g.mutable_nodes();
  const Uses uses(g);
  std::vector<bool> erased(nodes.size());
  // Forward: a linear with a bias whose output a (an activation written once) a later gelu reads.
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& l = nodes[i];
    if (l.op != &kLinear || l.inputs.size() != 3 || l.accumulate) continue;
    const ValueId a = l.outputs[0];
    if (!is_activation(g, a) || uses.writers[size_t(a)] != 1) continue;
    for (size_t j = i + 1; j < nodes.size(); ++j) {
      const Node& gelu = nodes[j];
      if (erased[j] || gelu.op != &kGelu || gelu.inputs[0] != a) continue;
      const ValueId f = gelu.outputs[0];
      if (gelu.accumulate || !is_activation(g, f) || uses.writers[size_t(f)] != 1 ||
          g.value(f).dtype != g.value(a).dtype)
        break;
      nodes[i] = Node{&kLinearGelu, l.inputs, {a, f}, {}, false, l.backward, l.name, l.unit};
      erased[j] = true;
      ++fused.forward;
      break;
    }
  }
  // Backward: a gelu_backward whose incoming gradient df only a linear_backward_input writes and
  // only it reads.
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Node& gelu = nodes[j];
    if (erased[j] || gelu.op != &kGeluBackward || gelu.accumulate) continue;
    const ValueId a = gelu.inputs[0], df = gelu.inputs[1], da = gelu.outputs[0];
    if (!is_activation(g, da) || uses.writers[size_t(da)] != 1 || !is_activation(g, df) ||
        uses.writers[size_t(df)] != 1 || uses.readers[size_t(df)] != 1 || g.value(da).dtype != g.value(a).dtype)
      continue;
    size_t i = 0;
    while (i < j && !(nodes[i].outputs.size() == 1 && nodes[i].outputs[0] == df)) ++i;
    if (i == j || erased[i] || nodes[i].op != &kLinearBackwardInput || nodes[i].accumulate) continue;
    const Node& product = nodes[i];
    // The product moves from i to j: what it reads must not change in between.
    if (writes_between(nodes, i, j, product.inputs)) continue;
    nodes[j] =
        Node{&kLinearBackwardInputGelu, {product.inputs[0], product.inputs[1], a}, {da}, {}, false, true, gelu.name};
    erased[i] = true;
    ++fused.backward;
  }
  g.remove_nodes(erased);
  return fused;
}

}  // namespace engine::ops
