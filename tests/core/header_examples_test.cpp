// The usage examples at the top of headers, as code that compiles and runs, so that an example
// which drifts from its API breaks this build: graph/graph.h's graph, runtime/executor.h's replay,
// optim/optimizer.h's update and optim/loss_scaler.h's scaler, each written as its header writes it
// (with what the header leaves to the reader made concrete).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "dist/zero_step.h"
#include "graph/graph.h"
#include "linalg/linear.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "plan/plan.h"
#include "recipe/load.h"
#include "runtime/executor.h"
#include "runtime/parameters.h"

namespace engine {
namespace {

recipe::Recipe quickstart(std::vector<std::string> overrides) {
  recipe::LoadOptions options;
  options.overrides = std::move(overrides);
  return recipe::load_recipe(std::filesystem::path(ENGINE_SOURCE_DIR) / "recipes/quickstart.yaml", options).recipe;
}

TEST(HeaderExamples, GraphExecutorAndOptimizer) {
  // graph/graph.h
  Graph g;
  const int64_t C = 64;
  int unit = g.add_unit("block.0");
  ValueId x = g.add_input("x", Shape{8, C}, DType::f32);
  ValueId w = g.add_param("h.0.mlp.c_fc.weight", Shape{4 * C, C}, unit, ParamInit::normal(0.02));
  ValueId b = g.add_param("h.0.mlp.c_fc.bias", Shape{4 * C}, unit, ParamInit::zeros(), /*decay=*/false);
  ValueId y = ops::linear(g, x, w, b, "h.0.mlp.c_fc");
  ASSERT_EQ(g.value(y).shape, (Shape{8, 4 * C}));
  g.mark_forward_end();

  // runtime/executor.h
  ParameterStore store(g);
  store.initialize(1);
  const ValueId tokens = x, output = y;
  std::vector<float> batch(size_t(8 * C), 0.5f);
  const size_t bytes = batch.size() * sizeof(float);
  const uint64_t step = 0, micro_step = 0;
  Executor exec(g, store, /*seed=*/1337);  // store: the model's ParameterStore
  exec.add_plan("train", plan_step(g, all_nodes(g), {output}));
  std::memcpy(exec.input(tokens), batch.data(), bytes);
  store.zero_micro_grads();
  exec.run("train", step, micro_step);
  const float* out = exec.value_f32("train", output);  // an activation the plan kept
  EXPECT_TRUE(std::isfinite(out[0]));

  // optim/optimizer.h, with one rank's ZeroStep (dist/zero_step.h)
  const recipe::Recipe recipe = quickstart({"train.gradient_clipping=0.5"});
  const auto comm = make_local_communicator();
  ZeroStep zero(store, *comm);
  zero.finish_gradients();
  for (int64_t i = 0; i < store.numel(0); ++i) store.grad(0)[i] = 0.25f;  // as a backward would leave them
  auto optimizer = make_optimizer(recipe.optimizer, store);
  const double norm = zero.gradient_norm();  // global L2 norm, every rank
  scale_gradients(store, clip_factor(norm, recipe.train.gradient_clipping));
  const float before = store.master(0)[0];
  optimizer->step(learning_rate(recipe, int64_t(step)));
  EXPECT_GT(norm, 0.5);
  EXPECT_NE(store.master(0)[0], before);
}

TEST(HeaderExamples, LossScaler) {
  // optim/loss_scaler.h (the scaler's part of it)
  const recipe::Recipe recipe = quickstart({"precision.mode=fp16", "precision.hysteresis=1"});
  LossScaler scaler(recipe.precision);
  const double scale = scaler.scale();
  const bool overflow = !std::isfinite(INFINITY);
  EXPECT_NE(scaler.update(overflow), LossScaler::Outcome::min_scale);
  EXPECT_LT(scaler.scale(), scale);  // an overflow with no hysteresis left lowers the scale
}

}  // namespace
}  // namespace engine
