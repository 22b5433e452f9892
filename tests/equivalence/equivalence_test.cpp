// Equivalence of the step's levers with the plain path: accumulation against one large batch,
// every checkpointing policy against none, and bf16/fp16 training against fp32.
#include <gtest/gtest.h>

#include <cmath>

#include "run_util.h"

namespace engine {
namespace {

using testing::quickstart;
using testing::relative_error;
using testing::run;

// The whole model, and LoRA adapters over a frozen base.
TEST(Accumulation, FourMicroBatchesOfEightEqualOneBatchOfThirtyTwo) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"})
    for (const char* lora : {"lora.rank=0", "lora.rank=4"}) {
      auto accumulated = quickstart({arch, lora, "train.micro_batch_size=8", "train.gradient_accumulation_steps=4"});
      auto whole = quickstart({arch, lora, "train.micro_batch_size=32", "train.gradient_accumulation_steps=1"});
      ASSERT_EQ(*accumulated.recipe.train.global_batch_size, 32);
      ASSERT_EQ(*whole.recipe.train.global_batch_size, 32);
      testing::Run a = run(accumulated.recipe, 10), b = run(whole.recipe, 10);
      const std::string what = std::string(arch) + " " + lora;
      for (size_t s = 0; s < a.losses.size(); ++s)
        EXPECT_NEAR(a.losses[s], b.losses[s], 1e-6 * std::abs(b.losses[s])) << what << " step " << s;
      for (size_t p = 0; p < a.first_gradients.size(); ++p)
        EXPECT_LT(relative_error(a.first_gradients[p], b.first_gradients[p]), 1e-5) << what << " parameter " << p;
    }
}

TEST(Accumulation, SixteenBitGradientsAccumulateInTheirOwnType) {
  // bf16 accumulation rounds each micro-batch's sum: close to fp32 accumulation, not equal to it.
  auto fp32_sum =
      quickstart({"precision.mode=bf16", "train.micro_batch_size=4", "train.gradient_accumulation_steps=4"});
  auto bf16_sum = quickstart({"precision.mode=bf16", "precision.accumulation_dtype=bf16", "train.micro_batch_size=4",
                              "train.gradient_accumulation_steps=4"});
  testing::Run a = run(fp32_sum.recipe, 3), b = run(bf16_sum.recipe, 3);
  double worst = 0;
  bool differs = false;
  for (size_t p = 0; p < a.first_gradients.size(); ++p) {
    worst = std::max(worst, relative_error(b.first_gradients[p], a.first_gradients[p]));
    differs = differs || a.first_gradients[p] != b.first_gradients[p];
  }
  EXPECT_TRUE(differs) << "bf16 accumulation gave exactly the fp32 sums";
  EXPECT_LT(worst, 2e-2);
}

// Recompute runs the same kernels on the same inputs: equal to the last bit, dropout included.
TEST(Checkpointing, EveryPolicyIsBitIdenticalToNone) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
    std::vector<std::string> base{arch, "model.n_layer=3", "train.micro_batch_size=4"};
    if (std::string(arch) == "model.arch=gpt") base.push_back("model.dropout=0.1");
    auto plain = quickstart(base);
    testing::Run reference = run(plain.recipe, 4);
    for (std::vector<std::string> policy : std::vector<std::vector<std::string>>{
             {"activation_checkpointing.policy=full"},
             {"activation_checkpointing.policy=full", "activation_checkpointing.cpu_checkpointing=true"},
             {"activation_checkpointing.policy=every_k", "activation_checkpointing.k=2"},
             {"activation_checkpointing.policy=every_k", "activation_checkpointing.k=2",
              "activation_checkpointing.cpu_checkpointing=true"},
             {"activation_checkpointing.policy=selective"}}) {
      std::vector<std::string> overrides = base;
      overrides.insert(overrides.end(), policy.begin(), policy.end());
      auto checkpointed = quickstart(overrides);
      testing::Run r = run(checkpointed.recipe, 4);
      const std::string what = std::string(arch) + " " + policy.back();
      EXPECT_EQ(r.losses, reference.losses) << what;
      EXPECT_EQ(r.first_gradients, reference.first_gradients) << what;
      EXPECT_EQ(r.weights, reference.weights) << what;
    }
  }
}

// The same in bf16, where the recomputed forward must also round to bf16 exactly as the stored
// activations did: selective checkpointing (and full, for contrast) against none, to the last bit.
TEST(Checkpointing, SelectiveAndFullAreBitIdenticalToNoneInBf16) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
    std::vector<std::string> base{arch, "precision.mode=bf16", "model.n_layer=3", "train.micro_batch_size=4"};
    if (std::string(arch) == "model.arch=gpt") base.push_back("model.dropout=0.1");
    testing::Run reference = run(quickstart(base).recipe, 4);
    for (const char* policy : {"activation_checkpointing.policy=selective", "activation_checkpointing.policy=full"}) {
      std::vector<std::string> overrides = base;
      overrides.push_back(policy);
      auto checkpointed = quickstart(overrides);
      const std::string what = std::string(arch) + " bf16 " + policy;
      ASSERT_GT(compile_step(checkpointed.recipe).recompute.cloned_nodes, 0) << what << " recomputes nothing";
      testing::Run r = run(checkpointed.recipe, 4);
      EXPECT_EQ(r.losses, reference.losses) << what;
      EXPECT_EQ(r.first_gradients, reference.first_gradients) << what;
      EXPECT_EQ(r.weights, reference.weights) << what;
    }
  }
}

TEST(Checkpointing, PoliciesSaveActivationMemoryAndCostRecompute) {
  auto plan_of = [](std::vector<std::string> overrides) {
    overrides.push_back("model.n_layer=4");
    return compile_step(quickstart(overrides).recipe);
  };
  CompiledStep none = plan_of({});
  CompiledStep full = plan_of({"activation_checkpointing.policy=full"});
  CompiledStep every = plan_of({"activation_checkpointing.policy=every_k", "activation_checkpointing.k=2"});
  CompiledStep selective = plan_of({"activation_checkpointing.policy=selective"});
  CompiledStep offloaded =
      plan_of({"activation_checkpointing.policy=full", "activation_checkpointing.cpu_checkpointing=true"});
  EXPECT_EQ(none.recompute.cloned_nodes, 0);
  EXPECT_LT(full.train.arena_bytes, every.train.arena_bytes);
  EXPECT_LT(every.train.arena_bytes, none.train.arena_bytes);
  EXPECT_LT(selective.train.arena_bytes, none.train.arena_bytes);
  EXPECT_LT(offloaded.train.arena_bytes, full.train.arena_bytes);
  EXPECT_GT(offloaded.memory.host, 0);
  // Full recompute reruns every block's forward: more FLOPs than every other block, more than selective.
  EXPECT_GT(full.recompute.extra_flops, every.recompute.extra_flops);
  EXPECT_GT(every.recompute.extra_flops, selective.recompute.extra_flops);
  EXPECT_GT(selective.recompute.extra_flops, 0);
  EXPECT_NEAR(full.flops_per_micro_batch, none.flops_per_micro_batch + full.recompute.extra_flops,
              1e-9 * none.flops_per_micro_batch);
}

}  // namespace
}  // namespace engine
