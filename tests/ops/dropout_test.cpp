// dropout: the mask keeps 1 - p of the elements, scales them by 1 / (1 - p), is the same in the
// backward as in the forward, and changes from step to step but not between runs.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "graph/autodiff.h"
#include "nn/dropout.h"
#include "plan/plan.h"
#include "runtime/executor.h"

namespace engine {
namespace {

void sum_cpu(const Node& node, const KernelContext& ctx) {
  double s = 0;
  for (int64_t i = 0; i < ctx.shape(node.inputs[0]).numel(); ++i) s += ctx.f32(node.inputs[0])[i];
  *ctx.f32(node.outputs[0]) = float(s);
}
void sum_grad(GradBuilder& gb, const Node& node) {
  auto t = gb.target(node.inputs[0]);
  gb.emit(kAccumulate, {node.inputs[1]}, {t.value}, t, {}, node.name);
}
const OpDef kSumWithOnes{.name = "sum", .cpu = sum_cpu, .grad = sum_grad};

TEST(Dropout, MaskIsConsistentScaledAndFreshEachStep) {
  const int64_t n = 100'000;
  const double p = 0.3;
  Graph g;
  int unit = g.add_unit("u");
  ValueId x = g.add_param("x", Shape{n}, unit, ParamInit::ones());
  ValueId y = ops::dropout(g, x, p, "drop");
  ValueId ones = g.add_input("ones", Shape{n}, DType::f32);
  ValueId loss = g.add_activation("loss", Shape{1});
  g.add_node(Node{&kSumWithOnes, {y, ones}, {loss}, {}, false, false, "sum"});
  g.set_loss(loss);
  g.mark_forward_end();
  autodiff(g);
  ParameterStore store(g);
  store.initialize(1);
  Executor exec(g, store, 42);
  exec.add_plan("step", plan_step(g, all_nodes(g), {y}));
  std::fill_n(static_cast<float*>(exec.input(ones)), n, 1.0f);

  auto run = [&](uint64_t step) {
    store.zero_micro_grads();
    exec.run("step", step, 0);
    const float* out = exec.value_f32("step", y);
    return std::vector<float>(out, out + n);
  };
  std::vector<float> first = run(0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(first[size_t(i)] == 0.0f || std::abs(first[size_t(i)] - float(1 / (1 - p))) < 1e-6f);
    kept += first[size_t(i)] != 0.0f;
    ASSERT_EQ(store.grad(0)[i], first[size_t(i)]) << "backward mask differs from forward at " << i;
  }
  double expected = double(n) * (1 - p), sigma = std::sqrt(double(n) * p * (1 - p));
  EXPECT_NEAR(double(kept), expected, 5 * sigma);
  EXPECT_EQ(run(0), first) << "same step, same mask";
  EXPECT_NE(run(1), first) << "a new step draws a new mask";
}

TEST(Dropout, ProbabilitiesOfOneOrMoreAndNanAreRefused) {
  Graph g;
  ValueId x = g.add_param("x", Shape{4}, g.add_unit("u"), ParamInit::ones());
  for (double p : {1.0, 1.5, double(NAN), double(INFINITY)}) {
    try {
      ops::dropout(g, x, p, "drop");
      ADD_FAILURE() << "dropout " << p << " accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("layer drop: dropout probability must be below 1"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(ops::dropout(g, x, 0.0, "drop"), x);
}

}  // namespace
}  // namespace engine
