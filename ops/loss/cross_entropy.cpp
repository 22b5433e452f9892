#include "loss/cross_entropy.h"

#include <algorithm>

#include "nn/fast_math.h"

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
#pragma omp simd reduction(max : max_logit)
    for (int64_t v = 0; v < vocab; ++v) max_logit = std::max(max_logit, z[v]);
    // Exponentials in float (vectorised); the sum in double, a block of float partial sums at a time.
    double sum = 0;
    for (int64_t begin = 0; begin < vocab; begin += 1024) {
      const int64_t end = std::min(vocab, begin + 1024);
      float partial = 0.0f;
#pragma omp simd reduction(+ : partial)
      for (int64_t v = begin; v < end; ++v) partial += fast_exp(z[v] - max_logit);
      sum += partial;
    }
    const float log_sum = float(std::log(sum)) + max_logit;
    const int32_t target = targets[r];
    losses[r] = log_sum - z[target];
#pragma omp simd
    for (int64_t v = 0; v < vocab; ++v) z[v] = fast_exp(z[v] - log_sum) * scale;
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
