#include "loss/cross_entropy.h"

#include <algorithm>

#include "core/convert.h"
#include "nn/fast_math.h"

#include <vector>

#include <cmath>

namespace engine::ops {

namespace {

// One row: the loss, and the row overwritten with its gradient (softmax - onehot) * scale.
float cross_entropy_row(float* z, int64_t vocab, int32_t target, float scale) {
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
  const float loss = log_sum - z[target];
#pragma omp simd
  for (int64_t v = 0; v < vocab; ++v) z[v] = fast_exp(z[v] - log_sum) * scale;
  z[target] -= scale;
  return loss;
}

void cross_entropy_cpu(const Node& node, const KernelContext& ctx) {
  const Shape& ls = ctx.shape(node.inputs[0]);
  int64_t rows = ls.rows(), vocab = ls.last();
  const int32_t* targets = ctx.i32(node.inputs[1]);
  float* losses = ctx.f32(node.outputs[0]);
  // The gradient of the mean loss, times the loss scale of fp16 training.
  const float scale = float(node.attrs.floats[0]) * ctx.loss_scale;
  const DType type = ctx.dtype(node.inputs[0]);
  if (type == DType::f32) {
    float* logits = ctx.f32(node.inputs[0]);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) losses[r] = cross_entropy_row(logits + r * vocab, vocab, targets[r], scale);
    return;
  }
  // 16-bit logits: each row is widened, computed in fp32 and its gradient rounded back in place.
  auto* logits = static_cast<std::byte*>(ctx.data(node.inputs[0]));
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      void* stored = logits + r * vocab * 2;
      widen(stored, type, row.data(), vocab);
      losses[r] = cross_entropy_row(row.data(), vocab, targets[r], scale);
      narrow(row.data(), stored, type, vocab);
    }
  }
}

// The logits buffer now holds their gradient: hand it to the op that produced them.
void cross_entropy_grad(GradBuilder& gb, const Node& node) {
  gb.pass_through(node.inputs[0], node.inputs[0], node.name);
}

}  // namespace

const OpDef kSoftmaxCrossEntropy{
    "softmax_cross_entropy",
    cross_entropy_cpu,
    cross_entropy_grad,
    [](const Graph& g, const Node& n) { return 5.0 * double(g.value(n.inputs[0]).shape.numel()); },
    "16-bit logits and their gradient, fp32 softmax and loss",
    0b1};

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
