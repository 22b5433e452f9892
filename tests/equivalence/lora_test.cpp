// LoRA's promises, checked by running both sides: adapters whose B starts at zero leave the first
// step exactly the base model's; only the adapters train (the frozen base is the same bits after
// training, and the plan holds gradients and optimizer state for the adapters alone); every
// checkpointing policy is bit-identical to none with LoRA too. Accumulation, ZeRO stages, offload
// and resume with LoRA are in their own suites (equivalence_test's Accumulation, zero_equivalence,
// offload_equivalence, resume: the Lora cases); PEFT as the reference is tests/hf.
#include <gtest/gtest.h>

#include <cmath>

#include "run_util.h"

namespace engine {
namespace {

using testing::quickstart;
using testing::run;

const std::vector<std::string> kLora = {"lora.rank=4", "lora.alpha=8"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Lora, AZeroBStartsAtTheBaseModelToTheBit) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"})
    for (const char* precision : {"precision.mode=fp32", "precision.mode=bf16"}) {
      const std::vector<std::string> base{arch, precision, "train.micro_batch_size=4"};
      const double plain = run(quickstart(base).recipe, 1).losses[0];
      const double adapted = run(quickstart(with(base, kLora)).recipe, 1).losses[0];
      EXPECT_EQ(adapted, plain) << arch << " " << precision;
    }
}

TEST(Lora, OnlyTheAdaptersTrainAndOnlyTheyHoldGradientsAndOptimizerState) {
  const recipe::Recipe plain = quickstart({"model.arch=llama"}).recipe;
  const recipe::Recipe r = quickstart({"model.arch=llama", "lora.rank=4", "lora.target_modules=q_proj,v_proj"}).recipe;
  Session session(r);
  const Graph& g = session.model.graph;
  ASSERT_FALSE(g.frozen().empty());
  int64_t adapter_elements = 0;
  for (const Param& p : g.params()) {
    EXPECT_TRUE(p.name.find(".lora_A.") != std::string::npos || p.name.find(".lora_B.") != std::string::npos)
        << p.name << " is trained";
    adapter_elements += g.value(p.value).shape.numel();
  }
  EXPECT_EQ(adapter_elements, g.param_count());
  EXPECT_EQ(g.frozen_count() + 0, compile_step(plain).model.graph.param_count());
  // No node writes a frozen weight, and no backward node computes a value nothing reads (a frozen
  // weight's gradient would be one).
  std::vector<bool> read(g.values().size(), false);
  for (const Node& node : g.nodes())
    for (ValueId in : node.inputs) read[size_t(in)] = true;
  for (const Node& node : g.nodes())
    for (ValueId out : node.outputs) {
      EXPECT_NE(g.value(out).placement, Placement::frozen) << node.name;
      if (node.backward && g.value(out).placement == Placement::activation) {
        EXPECT_TRUE(read[size_t(out)]) << node.op->name << " " << node.name << " writes " << g.value(out).name
                                       << ", which nothing reads";
      }
    }
  const MemoryPlan memory = session.memory(), full = compile_step(plain).memory;
  EXPECT_EQ(memory.frozen, g.frozen_count() * 4);
  EXPECT_LT(memory.optimizer_state, full.optimizer_state / 20);
  EXPECT_LT(memory.gradients, full.gradients / 20);

  session.store.initialize(uint64_t(r.run.seed));
  std::vector<std::vector<float>> frozen_before, adapters_before;
  for (size_t i = 0; i < g.frozen().size(); ++i) frozen_before.push_back(session.store.frozen_values(int(i)));
  for (size_t i = 0; i < g.params().size(); ++i) {
    const float* w = session.store.param(int(i));
    adapters_before.emplace_back(w, w + session.store.numel(int(i)));
  }
  testing::Run trained = run(r, 3);
  Session again(r);  // run() trains its own session: compare its weights with a fresh start
  again.store.initialize(uint64_t(r.run.seed));
  for (size_t i = 0; i < g.frozen().size(); ++i)
    EXPECT_EQ(again.store.frozen_values(int(i)), frozen_before[i]) << g.frozen()[i].name;
  bool every_b_moved = true;
  for (size_t i = 0; i < g.params().size(); ++i)
    if (g.params()[i].name.find(".lora_B.") != std::string::npos)
      every_b_moved = every_b_moved && trained.weights[i] != adapters_before[i];
  EXPECT_TRUE(every_b_moved) << "an adapter's B never left zero";
}

TEST(Lora, FrozenWeightsStayTheirBitsThroughTraining) {
  const recipe::Recipe r = quickstart({"model.arch=gpt", "lora.rank=4", "precision.mode=bf16"}).recipe;
  Session session(r);
  session.store.initialize(uint64_t(r.run.seed));
  std::vector<std::vector<float>> before;
  for (size_t i = 0; i < session.model.graph.frozen().size(); ++i)
    before.push_back(session.store.frozen_values(int(i)));
  int64_t index = 0;
  for (int64_t step = 0; step < 3; ++step)
    session.train_step(step, [&] {
      Batch batch(session.micro_batch, session.model.sequence, session.data->features());
      session.data->fill(Split::train, index++, batch);
      return batch;
    });
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(session.store.frozen_values(int(i)), before[i]) << session.model.graph.frozen()[i].name;
}

TEST(Lora, EveryCheckpointingPolicyIsBitIdenticalToNone) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
    const std::vector<std::string> base =
        with({arch, "model.n_layer=3", "train.micro_batch_size=4", "lora.dropout=0.1"}, kLora);
    testing::Run reference = run(quickstart(base).recipe, 3);
    for (std::vector<std::string> policy : std::vector<std::vector<std::string>>{
             {"activation_checkpointing.policy=full"},
             {"activation_checkpointing.policy=full", "activation_checkpointing.cpu_checkpointing=true"},
             {"activation_checkpointing.policy=selective"}}) {
      testing::Run r = run(quickstart(with(base, policy)).recipe, 3);
      const std::string what = std::string(arch) + " " + policy.back();
      EXPECT_EQ(r.losses, reference.losses) << what;
      EXPECT_EQ(r.first_gradients, reference.first_gradients) << what;
      EXPECT_EQ(r.weights, reference.weights) << what;
    }
  }
}

}  // namespace
}  // namespace engine
