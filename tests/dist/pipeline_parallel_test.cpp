// Pipeline parallelism's promise, checked by running both sides: the model cut into P stages, fed
// with the step's M micro-batches on 1F1B or GPipe, trains to the bits of one process accumulating
// the same micro-batches: the same losses, gradient norms and final weights, byte for byte. A stage
// computes its blocks' ops on the values the whole model would give them (the activations cross in
// fp32, exactly, whatever the precision), the backward recomputes the forward with the same dropout
// masks, each stage accumulates its gradients in micro-batch order, and the gradient norm adds the
// stages' partial sums in the whole model's order. With ZeRO over the data-parallel ranks and with
// recompute too. The one exception is an embedding tied to the LM head: the first and last stage
// each sum their own micro-batches' gradients before adding the two, where one process adds them
// per micro-batch, so GPT-2 (tied) trains within fp32's reordering tolerance (as
// tensor_parallel_test.cpp derives it) rather than to the bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../temp_dir.h"
#include "engine_runs.h"

namespace {

using engine::testing::expect_close_fp32;
using engine::testing::train;
using engine::testing::Training;

void expect_same_bits(const Training& pipelined, const Training& whole, const std::string& what) {
  ASSERT_EQ(pipelined.steps.size(), whole.steps.size()) << what << "\n" << pipelined.output;
  for (size_t s = 0; s < whole.steps.size(); ++s)
    for (const char* field : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(pipelined.steps[s][field], whole.steps[s][field]) << what << ": " << field << " of step " << s + 1;
  EXPECT_TRUE(pipelined.weights == whole.weights) << what << ": the final weights differ";
}

std::string with(const std::string& recipe, const std::string& overrides) { return recipe + " " + overrides; }

const char* kLlama = "recipes/golden/llama_markov.yaml";  // an untied head

// P = 2 on 1F1B and on GPipe against one process accumulating the 4 micro-batches.
TEST(PipelineParallel, TwoStagesOnEitherScheduleAreOneProcessBitForBit) {
  const engine::testing::TempDir dir("pp_two");
  const std::string recipe = with(kLlama, "train.gradient_accumulation_steps=4");
  const Training whole = train(recipe, 1, (dir / "w1").string());
  expect_same_bits(train(with(recipe, "distributed.pipeline_parallel=2"), 2, (dir / "p2").string()), whole,
                   "P=2, 1F1B");
  expect_same_bits(train(with(recipe, "distributed.pipeline_parallel=2 distributed.pipeline_schedule=gpipe"), 2,
                         (dir / "gpipe").string()),
                   whole, "P=2, GPipe");
}

// Stages cut where distributed.pipeline_blocks says (1 block, then 3): the plan's stage table shows
// the cut, and the run is one process's bits.
TEST(PipelineParallel, StagesCutAsTheRecipeListsAreOneProcessBitForBit) {
  const engine::testing::TempDir dir("pp_blocks");
  const std::string recipe = with(kLlama, "model.n_layer=4 train.gradient_accumulation_steps=4");
  const std::string listed = with(recipe, "distributed.pipeline_parallel=2 distributed.pipeline_blocks=[1,3]");
  const engine::testing::Shell plan = engine::testing::shell("'" ENGINE_BINARY "' plan " SOURCE_DIR "/" + listed);
  ASSERT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("0  embeddings .. layers.0 "), std::string::npos) << plan.output;
  EXPECT_NE(plan.output.find("1  layers.1 .. head "), std::string::npos) << plan.output;
  expect_same_bits(train(listed, 2, (dir / "p2").string()), train(recipe, 1, (dir / "w1").string()), "P=2 cut 1 + 3");
}

// P = 4 (one block each, the embedding and the head with the first and last) in bf16, M = 6.
TEST(PipelineParallel, FourStagesInBf16AreOneProcessBitForBit) {
  const engine::testing::TempDir dir("pp_four");
  const std::string recipe = with(kLlama, "model.n_layer=4 precision.mode=bf16 train.gradient_accumulation_steps=6");
  expect_same_bits(train(with(recipe, "distributed.pipeline_parallel=4"), 4, (dir / "p4").string()),
                   train(recipe, 1, (dir / "w1").string()), "P=4, bf16");
}

// P = 2 x D = 2 at every ZeRO stage, every block recomputed, against one process accumulating 4; and
// at ZeRO 3 with the optimizer state, masters and parameter shards offloaded to NVMe swap files
// (named by world rank: the stages share their data-parallel ranks).
TEST(PipelineParallel, TwoStagesByTwoDataRanksAtEveryZeroStageAreOneProcessBitForBit) {
  const engine::testing::TempDir dir("pp_zero");
  const Training whole = train(with(kLlama, "train.gradient_accumulation_steps=4"), 1, (dir / "w1").string());
  for (int stage = 0; stage <= 3; ++stage)
    expect_same_bits(train(with(kLlama,
                                "distributed.pipeline_parallel=2 train.gradient_accumulation_steps=2 "
                                "activation_checkpointing.policy=full distributed.zero_stage=" +
                                    std::to_string(stage)),
                           4, (dir / ("s" + std::to_string(stage))).string()),
                     whole, "P=2 x D=2, ZeRO stage " + std::to_string(stage));
  expect_same_bits(train(with(kLlama,
                              "distributed.pipeline_parallel=2 train.gradient_accumulation_steps=2 "
                              "distributed.zero_stage=3 offload.optimizer=nvme offload.parameters=nvme "
                              "offload.nvme_path=" +
                                  (dir / "swap").string()),
                         4, (dir / "nvme").string()),
                   whole, "P=2 x D=2, ZeRO 3, NVMe offload");
}

// LoRA: each stage holds its blocks' frozen weights and adapters (a frozen tied embedding on the first
// and last stage alike, with no gradient to share), so GPT-2 too trains the one-process adapters
// bit for bit, with dropout in the model and in the adapters, from a base and an adapter too; and
// T = 2 x P = 2 within fp32's tolerance (tensor_parallel_test.cpp), resumed at another layout.
TEST(PipelineParallel, LoraStagesAreOneProcessBitForBit) {
  const engine::testing::TempDir dir("pp_lora");
  const std::string lora =
      "lora.rank=4 lora.alpha=8 lora.dropout=0.1 lora.target_modules=all-linear "
      "train.gradient_accumulation_steps=4";
  const std::string gpt = with("recipes/golden/gpt_markov.yaml model.dropout=0.1 checkpoint.every_steps=2", lora);
  const Training whole = train(gpt, 1, (dir / "g1").string());
  expect_same_bits(train(with(gpt, "distributed.pipeline_parallel=2"), 2, (dir / "g2").string()), whole,
                   "GPT LoRA, P=2");
  // Cut after step 2 and resumed in one process: the checkpoint names the whole frozen base (the tied
  // embedding once), so the resume is accepted and trains the same bits.
  train(with(gpt, "distributed.pipeline_parallel=2"), 2, (dir / "cut").string(), "--stop-after 2");
  expect_same_bits(train(gpt, 1, (dir / "cut").string(), "--resume latest"), whole, "GPT LoRA, P=2 resumed at P=1");
  // Started from files of the whole model: each stage loads its own weights of a base model
  // (model.init_from, a plain run's weights) and of a PEFT adapter (lora.init_from, the run above's).
  const std::string base = (dir / "base" / "run" / "model.safetensors").string(), adapter = (dir / "adapter").string();
  train("recipes/golden/gpt_markov.yaml", 1, (dir / "base").string());
  const engine::testing::Shell exported = engine::testing::shell(
      "'" ENGINE_BINARY "' export " + (dir / "g1" / "run").string() + " " + adapter + " --adapter");
  ASSERT_EQ(exported.status, 0) << exported.output;
  const std::string from = with(gpt, "model.init_from=" + base + " lora.init_from=" + adapter);
  expect_same_bits(train(with(from, "distributed.pipeline_parallel=2"), 2, (dir / "from2").string()),
                   train(from, 1, (dir / "from1").string()), "GPT LoRA from a base and an adapter, P=2");
  // Three blocks over two stages, split in two: cut after step 2 and resumed in one process (the
  // checkpoint's base digest is the whole model's whatever the layout).
  const std::string llama = with(kLlama, lora + " model.n_layer=3 checkpoint.every_steps=2");
  const std::string split = with(llama, "distributed.pipeline_parallel=2 distributed.tensor_parallel=2");
  const Training llama_whole = train(llama, 1, (dir / "l1").string());
  expect_close_fp32(train(split, 4, (dir / "l22").string()), llama_whole, 0.005, "Llama LoRA, T=2 x P=2");
  train(split, 4, (dir / "l22cut").string(), "--stop-after 2");
  expect_close_fp32(train(llama, 1, (dir / "l22cut").string(), "--resume latest"), llama_whole, 0.005,
                    "Llama LoRA, T=2 x P=2 resumed in one process");
}

// GPT-2's tied embedding: the first and last stage hold it, sum their gradients and stay in step;
// dropout draws the whole model's masks and evaluation runs through the stages.
TEST(PipelineParallel, ATiedEmbeddingStaysOneWeightAcrossTheFirstAndLastStage) {
  const engine::testing::TempDir dir("pp_tied");
  const std::string recipe =
      "recipes/golden/gpt_markov.yaml model.dropout=0.1 train.eval_every=2 "
      "train.eval_batches=3 train.gradient_accumulation_steps=4";
  const Training whole = train(recipe, 1, (dir / "w1").string());
  const Training pipelined = train(with(recipe, "distributed.pipeline_parallel=2"), 2, (dir / "p2").string());
  ASSERT_EQ(pipelined.steps.size(), whole.steps.size()) << pipelined.output;
  for (size_t s = 0; s < whole.steps.size(); ++s) {
    const double loss = whole.steps[s]["loss"], norm = whole.steps[s]["grad_norm"];
    EXPECT_NEAR(pipelined.steps[s]["loss"].get<double>(), loss, 1e-6 * loss) << "step " << s + 1;
    EXPECT_NEAR(pipelined.steps[s]["grad_norm"].get<double>(), norm, 1e-5 * norm) << "step " << s + 1;
  }
  for (const auto& [name, values] : whole.weights) {
    const std::vector<float>& other = pipelined.weights.at(name);
    ASSERT_EQ(other.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_NEAR(other[i], values[i], 1e-2 * 0.01 * 4) << name << "[" << i << "]";  // 1e-2 of lr x steps
  }
  EXPECT_NE(pipelined.output.find("validation loss"), std::string::npos) << pipelined.output;
  // 1F1B and GPipe: the same bits (the same passes, in another order).
  expect_same_bits(train(with(recipe, "distributed.pipeline_parallel=2 distributed.pipeline_schedule=gpipe"), 2,
                         (dir / "gpipe").string()),
                   pipelined, "GPipe against 1F1B");
}

// Each stage's measured idle fraction is reported beside the schedule's bubble (P - 1) / (M + P - 1),
// and the bytes a stage sends are the activations (stage 0) it hands on: M x B x S x C x 4 per step,
// plus the step's scalar collectives.
TEST(PipelineParallel, TheBubbleIsMeasuredAndTheBytesAreTheActivations) {
  const engine::testing::TempDir dir("pp_bubble");
  const Training run = train(with(kLlama, "distributed.pipeline_parallel=2 train.gradient_accumulation_steps=4"), 2,
                             (dir / "p2").string());
  const double P = 2, M = 4;
  EXPECT_DOUBLE_EQ(run.summary.value("pipeline_bubble", -1.0), (P - 1) / (M + P - 1));
  const auto idle = run.summary.at("pipeline_idle_fraction_per_stage").get<std::vector<double>>();
  ASSERT_EQ(idle.size(), 2u);
  for (double f : idle) {
    EXPECT_GE(f, 0.0);
    EXPECT_LT(f, 1.0);
  }
  EXPECT_NE(run.output.find("the schedule's bubble (P - 1) / (M + P - 1) = 20.0%"), std::string::npos) << run.output;
  const int64_t activations = 4 * 4 * 16 * 32 * 4;  // M x B x S x C fp32
  EXPECT_EQ(run.summary.value("planned_bytes_sent_per_step", int64_t(-1)), activations);
  const int64_t measured = run.summary.value("bytes_sent_per_step", int64_t(-1));
  EXPECT_GE(measured, activations);
  EXPECT_LE(measured, activations + 1024) << "more than the step's scalar collectives";
}

// 3D: tensor-parallel groups of 2 in each of 2 stages (and 2 data-parallel replicas at ZeRO 1), against
// one process: within the tensor-parallel reordering (the stages themselves add none).
TEST(PipelineParallel, TensorParallelStagesTrainTheOneProcessModel) {
  const engine::testing::TempDir dir("pp_3d");
  const std::string gpt =
      "recipes/golden/gpt_markov.yaml model.dropout=0.1 train.eval_every=2 "
      "train.eval_batches=3 train.gradient_accumulation_steps=4";
  expect_close_fp32(
      train(with(gpt, "distributed.tensor_parallel=2 distributed.pipeline_parallel=2"), 4, (dir / "gpt_t2p2").string()),
      train(gpt, 1, (dir / "gpt").string()), 0.01, "GPT, T=2 x P=2");
  const std::string llama = with(kLlama, "model.n_head=4 model.kv_heads=2 train.gradient_accumulation_steps=4");
  expect_close_fp32(
      train(with(kLlama,
                 "model.n_head=4 model.kv_heads=2 train.gradient_accumulation_steps=2 "
                 "distributed.tensor_parallel=2 distributed.pipeline_parallel=2 distributed.zero_stage=1"),
            8, (dir / "llama_t2p2d2").string()),
      train(llama, 1, (dir / "llama").string()), 0.005, "Llama, T=2 x P=2 x D=2, ZeRO 1");
}

// fp16 with dynamic loss scaling at T = 2 x P = 2 (GPT, 2^22 to start): an overflow anywhere makes the
// whole model's gradient norm infinite on every rank, so all four ranks skip the steps one process
// skips (the first two), at the same scales, and then train within fp16's own distance from fp32.
TEST(PipelineParallel, Fp16OverflowsAreAgreedByEveryRankAsOneProcessHasThem) {
  const engine::testing::TempDir dir("pp_fp16");
  const std::string gpt = "recipes/golden/gpt_markov.yaml train.gradient_accumulation_steps=2";
  const std::string fp16 = with(gpt, "precision.mode=fp16 precision.initial_scale_power=22");
  const Training whole = train(fp16, 1, (dir / "w1").string());
  const Training split =
      train(with(fp16, "distributed.tensor_parallel=2 distributed.pipeline_parallel=2"), 4, (dir / "t2p2").string());
  ASSERT_EQ(split.steps.size(), whole.steps.size()) << split.output;
  int skipped = 0;
  for (size_t s = 0; s < whole.steps.size(); ++s) {
    skipped += whole.steps[s]["grad_norm"].is_null();
    EXPECT_EQ(split.steps[s]["grad_norm"].is_null(), whole.steps[s]["grad_norm"].is_null()) << "step " << s + 1;
    EXPECT_EQ(split.steps[s]["loss_scale"], whole.steps[s]["loss_scale"]) << "step " << s + 1;
  }
  EXPECT_EQ(skipped, 2) << "the one-process run's overflows";
  engine::testing::expect_close_16bit(split, whole, train(gpt, 1, (dir / "fp32").string()), "fp16, T=2 x P=2");
}

// --dump-first-gradients writes the whole model's gradients however the model is split: the stages'
// gradients gathered and the tensor-parallel slices assembled, under the weights file's names. P = 2
// gives one process's bits; T = 2 x P = 2 (GPT, tied: the embedding's gradient summed over both
// ends) gives them within fp32's reordering, 1e-5 of the largest gradient.
TEST(PipelineParallel, GradientDumpsAreTheWholeModelsGradientsAtAnyLayout) {
  const engine::testing::TempDir dir("pp_gradients");
  auto dump = [&](const std::string& recipe, int world, const std::string& name) {
    const std::string file = (dir / (name + ".safetensors")).string();
    train(recipe, world, (dir / name).string(), "--dump-first-gradients " + file);
    return engine::testing::read_safetensors(file);
  };
  const std::string llama = with(kLlama, "train.gradient_accumulation_steps=4");
  const engine::testing::Weights whole = dump(llama, 1, "llama");
  ASSERT_FALSE(whole.empty());
  EXPECT_TRUE(dump(with(llama, "distributed.pipeline_parallel=2"), 2, "llama_p2") == whole)
      << "P=2: the gradients differ from one process's";

  const std::string gpt = "recipes/golden/gpt_markov.yaml train.gradient_accumulation_steps=2";
  const engine::testing::Weights gpt_whole = dump(gpt, 1, "gpt");
  const engine::testing::Weights split =
      dump(with(gpt, "distributed.tensor_parallel=2 distributed.pipeline_parallel=2"), 4, "gpt_t2p2");
  ASSERT_EQ(split.size(), gpt_whole.size());
  double largest = 0;
  for (const auto& [name, values] : gpt_whole)
    for (float v : values) largest = std::max(largest, double(std::abs(v)));
  std::string where;
  EXPECT_LE(engine::testing::max_abs_difference(gpt_whole, split, &where), 1e-5 * largest)
      << "T=2 x P=2: the gradient of " << where;
}

// Checkpoints: each stage's ranks write their weights, the manifest describes every stage's, so a run
// resumes at its own layout and at another (P = 2 to one process; one process to P = 2 x D = 2 at
// ZeRO 2) with the bits of the run that never stopped, and `engine export` writes it whole.
TEST(PipelineParallel, CheckpointsResumeAtAnyLayoutWithTheSameBits) {
  const engine::testing::TempDir dir("pp_resume");
  const std::string recipe = with(kLlama, "train.gradient_accumulation_steps=4 checkpoint.every_steps=2");
  const Training whole = train(recipe, 1, (dir / "w1").string());
  const std::string staged = with(recipe, "distributed.pipeline_parallel=2");
  train(staged, 2, (dir / "cut").string(), "--stop-after 2");
  expect_same_bits(train(staged, 2, (dir / "cut").string(), "--resume latest"), whole, "P=2 cut and resumed");
  train(staged, 2, (dir / "to_one").string(), "--stop-after 2");
  expect_same_bits(
      train(with(recipe, "distributed.pipeline_parallel=1"), 1, (dir / "to_one").string(), "--resume latest"), whole,
      "P=2 resumed in one process");
  train(recipe, 1, (dir / "to_stages").string(), "--stop-after 2");
  expect_same_bits(train(with(recipe, "distributed.pipeline_parallel=2 distributed.zero_stage=2"), 4,
                         (dir / "to_stages").string(), "--resume latest"),
                   whole, "one process resumed at P=2 x D=2, ZeRO 2");
  const std::string exported = (dir / "exported.safetensors").string();
  const engine::testing::Shell exporting = engine::testing::shell(
      "'" ENGINE_BINARY "' export " + (dir / "cut" / "run" / "checkpoints").string() + " " + exported);
  ASSERT_EQ(exporting.status, 0) << exporting.output;
  EXPECT_TRUE(engine::testing::read_safetensors(exported) == whole.weights) << "the exported checkpoint differs";
}

}  // namespace
