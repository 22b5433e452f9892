// Tensor parallelism's promise, checked by running both sides: the same recipe split across T ranks
// (and T x D with ZeRO over the data-parallel ranks) trains the model one process trains on the same
// global batch: the same losses, gradient norms and final weights within tolerances derived from the
// precision, and the bytes each rank sends are the Megatron-LM formulas'.
//
// Tolerances (docs/parallelism.md derives them):
// - fp32: a row-parallel layer sums T partial products where one process sums one, so each output
//   is a reordered fp32 sum, a few ulps (2^-24) apart; four steps do not amplify that in the loss
//   (relative 1e-6, seen 1e-8) or the gradient norm (1e-5). Adam divides each coordinate by its
//   gradient's size, so a weight moves at most lr per step whatever its gradient; a reordering moves
//   it by far less (1e-2 of lr x steps, seen 2e-4). The key bias is left out: softmax is invariant
//   to it, its exact gradient is zero, and Adam turns the rounding noise that is left into steps of
//   up to lr on either side.
// - bf16: every activation is rounded to 8 bits, so a reordered sum may round one ulp (2^-8) apart
//   and that difference travels. The bar is bf16's own: the split run's losses and weights stay
//   within twice as far from the one-process bf16 run as that run is from the fp32 one (seen: 0.4x
//   for the losses, 1.03x for the weights).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../temp_dir.h"
#include "engine_runs.h"

namespace {

using engine::testing::expect_close_16bit;
using engine::testing::expect_close_fp32;
using engine::testing::read_safetensors;
using engine::testing::train;
using engine::testing::Training;
using engine::testing::Weights;

const char* kGpt = "recipes/golden/gpt_markov.yaml model.dropout=0.1 train.eval_every=2 train.eval_batches=3";
// Grouped-query attention: 4 query heads over 2 key/value heads, split 2 and 1 per rank.
const char* kLlama = "recipes/golden/llama_markov.yaml model.n_head=4 model.kv_heads=2";
constexpr double kGptLr = 0.01, kLlamaLr = 0.005;

std::string with(const std::string& recipe, const std::string& overrides) { return recipe + " " + overrides; }

// T = 2 against one process; the same with 2 micro-batches accumulated and every block recomputed, and
// with the optimizer state offloaded.
TEST(TensorParallel, GptSplitInTwoTrainsTheOneProcessModel) {
  const engine::testing::TempDir dir("tp_gpt");
  const Training whole = train(kGpt, 1, (dir / "w1").string());
  expect_close_fp32(train(with(kGpt, "distributed.tensor_parallel=2"), 2, (dir / "t2").string()), whole, kGptLr, "T=2");
  const std::string accumulated =
      with(kGpt, "train.gradient_accumulation_steps=2 activation_checkpointing.policy=full");
  const Training split = train(with(accumulated, "distributed.tensor_parallel=2"), 2, (dir / "t2a2").string());
  expect_close_fp32(split, train(accumulated, 1, (dir / "w1a2").string()), kGptLr,
                    "T=2, accumulating 2 with recompute");
  // The optimizer state offloaded (each rank's slices' state): the same bits as without.
  const Training offloaded =
      train(with(accumulated, "distributed.tensor_parallel=2 offload.optimizer=cpu"), 2, (dir / "cpu").string());
  EXPECT_TRUE(offloaded.weights == split.weights) << "T=2 with offload.optimizer cpu: the final weights differ";
}

// T = 2 x D = 2 at every ZeRO stage (over the data-parallel ranks) against one process accumulating 2.
TEST(TensorParallel, GptTwoByTwoAtEveryZeroStageTrainsTheOneProcessModel) {
  const engine::testing::TempDir dir("tp_gpt_zero");
  const Training whole = train(with(kGpt, "train.gradient_accumulation_steps=2"), 1, (dir / "w1").string());
  for (int stage = 0; stage <= 3; ++stage)
    expect_close_fp32(train(with(kGpt, "distributed.tensor_parallel=2 distributed.zero_stage=" + std::to_string(stage)),
                            4, (dir / ("s" + std::to_string(stage))).string()),
                      whole, kGptLr, "T=2 x D=2, ZeRO stage " + std::to_string(stage));
}

// Four heads over four ranks: one head, a quarter of the MLP and of the vocabulary each.
TEST(TensorParallel, GptSplitInFourTrainsTheOneProcessModel) {
  const engine::testing::TempDir dir("tp_gpt4");
  const std::string four_heads = with(kGpt, "model.n_head=4");
  expect_close_fp32(train(with(four_heads, "distributed.tensor_parallel=4"), 4, (dir / "t4").string()),
                    train(four_heads, 1, (dir / "w1").string()), kGptLr, "T=4");
}

TEST(TensorParallel, LlamaWithGroupedQueryAttentionSplitTrainsTheOneProcessModel) {
  const engine::testing::TempDir dir("tp_llama");
  const Training whole = train(kLlama, 1, (dir / "w1").string());
  expect_close_fp32(train(with(kLlama, "distributed.tensor_parallel=2"), 2, (dir / "t2").string()), whole, kLlamaLr,
                    "T=2");
  const std::string accumulated = with(kLlama, "train.gradient_accumulation_steps=2");
  expect_close_fp32(
      train(with(kLlama, "distributed.tensor_parallel=2 distributed.zero_stage=3 activation_checkpointing.policy=full"),
            4, (dir / "t2d2").string()),
      train(accumulated, 1, (dir / "w1a2").string()), kLlamaLr, "T=2 x D=2, ZeRO stage 3, recompute");
  // Qwen2's q, k and v biases, split with their projections' rows.
  const std::string biased = with(kLlama, "model.qkv_bias=true");
  expect_close_fp32(train(with(biased, "distributed.tensor_parallel=2"), 2, (dir / "b2").string()),
                    train(biased, 1, (dir / "b1").string()), kLlamaLr, "T=2 with q, k and v biases");
}

TEST(TensorParallel, Bf16SplitRunsStayWithinBf16sOwnDistanceFromFp32) {
  const engine::testing::TempDir dir("tp_bf16");
  for (const auto& [name, recipe] : {std::pair<std::string, std::string>{"gpt", kGpt}, {"llama", kLlama}}) {
    const std::string accumulated = with(recipe, "train.gradient_accumulation_steps=2");
    const Training whole_fp32 = train(accumulated, 1, (dir / (name + "32")).string());
    const Training whole = train(with(accumulated, "precision.mode=bf16"), 1, (dir / (name + "16")).string());
    expect_close_16bit(train(with(accumulated, "precision.mode=bf16 distributed.tensor_parallel=2"), 2,
                             (dir / (name + "t2")).string()),
                       whole, whole_fp32, name + " bf16, T=2 accumulating 2");
    expect_close_16bit(train(with(recipe, "precision.mode=bf16 distributed.tensor_parallel=2 distributed.zero_stage=2"),
                             4, (dir / (name + "t2d2")).string()),
                       whole, whole_fp32, name + " bf16, T=2 x D=2, ZeRO stage 2");
  }
}

// LoRA split with its layers (models/lora.h): every linear layer adapted, with adapter dropout on
// split inputs too, trains the one-process adapters (the frozen base weights stay the same bits),
// for GPT with dropout at T = 2 and Llama with grouped-query attention at T = 2 x D = 2, ZeRO 2.
TEST(TensorParallel, LoraAdaptersSplitWithTheirLayersTrainTheOneProcessAdapters) {
  const engine::testing::TempDir dir("tp_lora");
  const std::string lora = "lora.rank=4 lora.alpha=8 lora.dropout=0.1 lora.target_modules=all-linear";
  const std::string gpt = with(kGpt, lora + " checkpoint.every_steps=2");
  const Training whole = train(gpt, 1, (dir / "g1").string());
  const std::string split = with(gpt, "distributed.tensor_parallel=2");
  const Training straight = train(split, 2, (dir / "gt2").string());
  expect_close_fp32(straight, whole, kGptLr, "GPT LoRA, T=2");

  // A checkpoint names the whole frozen base, whatever the layout: cut after step 2, the split run
  // resumes at its layout with the straight run's bits and in one process as one process trains;
  // `engine export` of its last checkpoint (the base from the seed, the adapters assembled whole,
  // merged) is the export of its final weights file.
  train(split, 2, (dir / "cut").string(), "--stop-after 2");
  const Training resumed = train(split, 2, (dir / "cut").string(), "--resume latest");
  ASSERT_EQ(resumed.steps.size(), straight.steps.size()) << resumed.output;
  for (size_t k = 0; k < straight.steps.size(); ++k)
    EXPECT_EQ(resumed.steps[k]["loss"], straight.steps[k]["loss"]) << "step " << k + 1;
  EXPECT_TRUE(resumed.weights == straight.weights) << "LoRA resumed at T=2: the final weights differ";
  train(split, 2, (dir / "to_whole").string(), "--stop-after 2");
  expect_close_fp32(train(gpt, 1, (dir / "to_whole").string(), "--resume latest"), whole, kGptLr,
                    "GPT LoRA, T=2 resumed in one process");
  const std::string from_checkpoint = (dir / "checkpoint.safetensors").string(),
                    from_weights = (dir / "weights.safetensors").string();
  const engine::testing::Shell exporting = engine::testing::shell(
      "'" ENGINE_BINARY "' export " + (dir / "gt2" / "run" / "checkpoints").string() + " " + from_checkpoint +
      " && '" ENGINE_BINARY "' export " + (dir / "gt2" / "run").string() + " " + from_weights);
  ASSERT_EQ(exporting.status, 0) << exporting.output;
  EXPECT_TRUE(read_safetensors(from_checkpoint) == read_safetensors(from_weights))
      << "the LoRA checkpoint exported is not the final weights exported";

  const std::string llama = with(kLlama, lora);
  expect_close_fp32(
      train(with(llama, "distributed.tensor_parallel=2 distributed.zero_stage=2"), 4, (dir / "lt2d2").string()),
      train(with(llama, "train.gradient_accumulation_steps=2"), 1, (dir / "l1").string()), kLlamaLr,
      "Llama LoRA, T=2 x D=2, ZeRO 2");
}

// Checkpoints hold each rank's slices and the manifest maps them to the whole tensors, so a run
// resumes at its own layout with the same bits, and at another layout (T x D changed both ways,
// ZeRO stage too) as the one-process run trains; `engine export` of a split run's checkpoint is its
// final weights file, bit for bit.
TEST(TensorParallel, CheckpointsResumeAtTheirLayoutExactlyAndAtAnotherAsOneProcessTrains) {
  const engine::testing::TempDir dir("tp_resume");
  const std::string recipe = with(kGpt, "train.gradient_accumulation_steps=2 checkpoint.every_steps=2");
  const Training whole = train(recipe, 1, (dir / "w1").string());

  // T = 2 (accumulating 2), cut after step 2 and resumed as it was: the straight run's bits.
  const std::string split = with(recipe, "distributed.tensor_parallel=2");
  const Training straight = train(split, 2, (dir / "straight").string());
  train(split, 2, (dir / "cut").string(), "--stop-after 2");
  const Training resumed = train(split, 2, (dir / "cut").string(), "--resume latest");
  ASSERT_EQ(resumed.steps.size(), straight.steps.size()) << resumed.output;
  for (size_t k = 0; k < straight.steps.size(); ++k)
    for (const char* field : {"loss", "grad_norm", "lr"})
      EXPECT_EQ(resumed.steps[k][field], straight.steps[k][field]) << field << " of step " << k + 1;
  EXPECT_TRUE(resumed.weights == straight.weights) << "resumed at its own layout: the final weights differ";

  // The split run's step-2 checkpoint continued unsplit at D = 2 and ZeRO 3; one process's
  // continued at T = 2 x D = 2 and ZeRO 1.
  train(split, 2, (dir / "to_whole").string(), "--stop-after 2");
  expect_close_fp32(train(with(recipe, "distributed.tensor_parallel=1 distributed.zero_stage=3"), 2,
                          (dir / "to_whole").string(), "--resume latest"),
                    whole, kGptLr, "T=2 resumed at T=1 x D=2");
  train(recipe, 1, (dir / "to_split").string(), "--stop-after 2");
  expect_close_fp32(train(with(recipe, "distributed.tensor_parallel=2 distributed.zero_stage=1"), 4,
                          (dir / "to_split").string(), "--resume latest"),
                    whole, kGptLr, "T=1 resumed at T=2 x D=2");

  // The straight split run's last checkpoint (step 4) exported whole.
  const std::string exported = (dir / "exported.safetensors").string();
  const engine::testing::Shell exporting = engine::testing::shell(
      "'" ENGINE_BINARY "' export " + (dir / "straight" / "run" / "checkpoints").string() + " " + exported);
  ASSERT_EQ(exporting.status, 0) << exporting.output;
  EXPECT_TRUE(read_safetensors(exported) == straight.weights) << "the exported checkpoint is not the final weights";
}

// Per micro-batch, Megatron-LM's count (Narayanan et al. 2021): each of the L blocks all-reduces its
// activations (B x S x C) twice in the forward and twice in the backward; so do the vocabulary-parallel
// embedding (forward) and the LM head's input (backward). A ring all-reduce sends 2 (T - 1) / T of the
// bytes. The vocabulary-parallel loss gathers each row's maximum (4 bytes) and its sum of exponentials
// and target logit (8 + 8) from every other rank. The measured bytes add only the step's scalar
// collectives (the gradient norm's partial sums: 8 bytes per 1024 parameters).
TEST(TensorParallel, TensorParallelBytesAreMegatronsFormula) {
  const engine::testing::TempDir dir("tp_bytes");
  for (const auto& [precision, bytes] : {std::pair<std::string, int64_t>{"fp32", 4}, {"bf16", 2}}) {
    const Training run = train(std::string("recipes/golden/gpt_markov.yaml precision.mode=") + precision +
                                   " distributed.tensor_parallel=2 train.gradient_accumulation_steps=2",
                               2, (dir / precision).string());
    const int64_t L = 2, B = 4, S = 16, C = 32, T = 2, micro_batches = 2;
    const int64_t all_reduce = 2 * (T - 1) * (B * S * C * bytes) / T;
    const int64_t formula = micro_batches * ((4 * L + 2) * all_reduce + (T - 1) * B * S * (4 + 16));
    EXPECT_EQ(run.summary.value("planned_tensor_bytes_sent_per_step", int64_t(-1)), formula) << precision;
    const int64_t measured = run.summary.value("tensor_bytes_sent_per_step", int64_t(-1));
    EXPECT_GE(measured, formula) << precision;
    EXPECT_LE(measured, formula + 1024) << precision << ": more than the step's scalar collectives";
  }
}

// A layout the ranks do not divide is refused before anything runs.
TEST(TensorParallel, AWorldTheGroupDoesNotDivideIsRefused) {
  const engine::testing::TempDir dir("tp_refused");
  const engine::testing::Shell refused = engine::testing::shell(
      "OMP_NUM_THREADS=1 " + std::string(MPIEXEC) +
      " --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS " MPIEXEC_NUMPROC_FLAG " 3 '" ENGINE_BINARY
      "' train " SOURCE_DIR "/recipes/golden/gpt_markov.yaml distributed.tensor_parallel=2 run.output_dir=" +
      (dir / "out").string());
  EXPECT_NE(refused.status, 0) << refused.output;
  EXPECT_NE(refused.output.find("distributed.tensor_parallel 2 does not divide the world size 3"), std::string::npos)
      << refused.output;
}

}  // namespace
