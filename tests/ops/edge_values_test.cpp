// Kernels at the edges of the float range, on values a model can produce: a layernorm row whose
// float sums overflow (bf16 holds values past 1e19), and a cross-entropy row whose first chunks are
// all -inf (masked logits) while the rest are so negative that exp(-log_sum) overflows a float.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "loss/cross_entropy.h"
#include "nn/layernorm.h"

namespace engine {
namespace {

// Runs `node` once on `values` (one vector per graph value, f32 or i32 bytes as given).
struct SingleOp {
  Graph graph;
  std::vector<std::vector<float>> memory;
  KernelContext context() {
    KernelContext ctx;
    ctx.graph = &graph;
    for (size_t i = 0; i < graph.values().size(); ++i) {
      ctx.pointers.push_back(memory[i].data());
      ctx.dtypes.push_back(graph.values()[i].dtype);
    }
    return ctx;
  }
};

TEST(EdgeValues, LayernormOfAHugeRowIsTheNormalisedRow) {
  const int64_t c = 64;
  SingleOp op;
  const ValueId x = op.graph.add_activation("x", Shape{1, c});
  const ValueId w = op.graph.add_activation("w", Shape{c});
  const ValueId b = op.graph.add_activation("b", Shape{c});
  const ValueId y = op.graph.add_activation("y", Shape{1, c});
  const ValueId mean = op.graph.add_activation("mean", Shape{1});
  const ValueId rstd = op.graph.add_activation("rstd", Shape{1});
  op.memory = {std::vector<float>(c),
               std::vector<float>(c, 1.0f),
               std::vector<float>(c, 0.0f),
               std::vector<float>(c),
               {0.0f},
               {0.0f}};
  for (int64_t i = 0; i < c; ++i) op.memory[size_t(x)][size_t(i)] = float(i % 2 ? 3e20 : -1e20) * float(1 + i % 5);
  const Node node{&ops::kLayerNorm, {x, w, b}, {y, mean, rstd}, Attrs{{0, 1}, {1e-5}}, false, false, "ln"};
  const KernelContext ctx = op.context();
  node.op->cpu(node, ctx);
  double reference_mean = 0, squares = 0;
  for (float v : op.memory[size_t(x)]) reference_mean += v;
  reference_mean /= double(c);
  for (float v : op.memory[size_t(x)]) squares += (v - reference_mean) * (v - reference_mean);
  const double reference_rstd = 1 / std::sqrt(squares / double(c) + 1e-5);
  for (int64_t i = 0; i < c; ++i) {
    const double expected = (op.memory[size_t(x)][size_t(i)] - reference_mean) * reference_rstd;
    EXPECT_NEAR(op.memory[size_t(y)][size_t(i)], expected, 1e-5 * (1 + std::abs(expected))) << i;
  }
}

TEST(EdgeValues, CrossEntropyAfterMaskedChunksHasAFiniteGradient) {
  const int64_t vocab = 3000, masked = 1100;  // past two 512-logit chunks
  SingleOp op;
  const ValueId logits = op.graph.add_activation("logits", Shape{1, vocab});
  const ValueId targets = op.graph.add_activation("targets", Shape{1}, DType::i32);
  const ValueId losses = op.graph.add_activation("losses", Shape{1});
  op.memory = {std::vector<float>(vocab), {0.0f}, {0.0f}};
  std::vector<double> z(vocab);
  for (int64_t v = 0; v < vocab; ++v) {
    z[size_t(v)] = v < masked ? -INFINITY : -100.0 - double(v % 7);
    op.memory[0][size_t(v)] = float(z[size_t(v)]);
  }
  const int32_t target = 2000;
  std::memcpy(op.memory[1].data(), &target, sizeof target);
  const Node node{&ops::kSoftmaxCrossEntropy, {logits, targets}, {losses}, Attrs{{}, {1.0}}, false, false, "ce"};
  const KernelContext ctx = op.context();
  node.op->cpu(node, ctx);
  double top = -INFINITY, sum = 0;
  for (double v : z) top = std::max(top, v);
  for (double v : z) sum += std::exp(v - top);
  const double log_sum = top + std::log(sum);
  EXPECT_NEAR(op.memory[2][0], log_sum - z[size_t(target)], 1e-5);
  for (int64_t v = 0; v < vocab; ++v) {
    const double expected = std::exp(z[size_t(v)] - log_sum) - (v == target ? 1.0 : 0.0);
    ASSERT_NEAR(op.memory[0][size_t(v)], expected, 1e-6) << "logit " << v;
  }
}

}  // namespace
}  // namespace engine
