#include "loss/cross_entropy.h"

#include <cmath>

namespace engine::ops {

namespace {

void cross_entropy_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& ls = ctx.shape(node.inputs[0]);
  int64_t rows = ls.rows(), vocab = ls.last();
  float* logits = ctx.f32(node.inputs[0]);
  const int32_t* targets = ctx.i32(node.inputs[1]);
  float* losses = ctx.f32(node.outputs[0]);
  const float scale = float(node.attrs.floats[0]);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    float* z = logits + r * vocab;
    float max_logit = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) max_logit = std::max(max_logit, z[v]);
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double(z[v]) - max_logit);
    double log_sum = std::log(sum) + max_logit;
    int32_t target = targets[r];
    losses[r] = float(log_sum - z[target]);
    for (int64_t v = 0; v < vocab; ++v) z[v] = float(std::exp(double(z[v]) - log_sum)) * scale;
    z[target] -= scale;
  }
}

// The logits buffer now holds their gradient: hand it to the op that produced them.
void cross_entropy_grad(GradBuilder& gb, const Node& node) {
  gb.pass_through(node.inputs[0], node.inputs[0], node.name);
}

}  // namespace

const OpDef kSoftmaxCrossEntropy{
    "softmax_cross_entropy", cross_entropy_cpu, cross_entropy_grad,
    [](const Graph& g, const Node& n) { return 5.0 * double(g.value(n.inputs[0]).shape.numel()); }};

ValueId softmax_cross_entropy(Graph& g, ValueId logits, ValueId targets, double scale, const std::string& name) {
  const Shape& ls = g.value(logits).shape;
  const Shape& ts = g.value(targets).shape;
  if (g.value(targets).dtype != DType::i32 || ts.numel() != ls.rows())
    shape_error(name, "targets " + ts.str() + " do not match logits " + ls.str());
  ValueId losses = g.add_activation(name + ".losses", Shape{ls.rows()});
  g.add_node(Node{&kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {scale}}, false, false, name});
  return losses;
}

}  // namespace engine::ops
