// Cross-field rules: the batch triad, derived defaults and consistency between sections.
#include "recipe_test_util.h"

namespace engine::recipe::testing {
namespace {

const char* kModel =
    "model: {arch: gpt, vocab_size: 64, context_length: 32, n_layer: 1, n_head: 2, n_embd: 32}\n"
    "data: {source: synthetic_markov}\n";

TrainSection train_of(const std::string& train, int64_t world = 1) {
  Files files = recipe(std::string(kModel) + "train: {steps: 1, " + train + "}\n");
  files.world = WorldSize{world, "test"};
  return files.load().recipe.train;
}

TEST(BatchTriad, MicroBatchAloneMeansNoAccumulation) {
  auto t = train_of("micro_batch_size: 8", 2);
  EXPECT_EQ(*t.gradient_accumulation_steps, 1);
  EXPECT_EQ(*t.global_batch_size, 16);
}

TEST(BatchTriad, MicroAndGlobalDetermineAccumulation) {
  auto t = train_of("micro_batch_size: 4, global_batch_size: 32", 2);
  EXPECT_EQ(*t.gradient_accumulation_steps, 4);
}

TEST(BatchTriad, GlobalAndAccumulationDetermineMicro) {
  auto t = train_of("global_batch_size: 48, gradient_accumulation_steps: 3", 2);
  EXPECT_EQ(*t.micro_batch_size, 8);
}

TEST(BatchTriad, GlobalAloneMeansOneMicroBatchPerRank) {
  auto t = train_of("global_batch_size: 12", 3);
  EXPECT_EQ(*t.micro_batch_size, 4);
  EXPECT_EQ(*t.gradient_accumulation_steps, 1);
}

TEST(BatchTriad, ConsistentTripleIsAccepted) {
  auto t = train_of("micro_batch_size: 2, gradient_accumulation_steps: 3, global_batch_size: 6");
  EXPECT_EQ(*t.global_batch_size, 6);
}

TEST(BatchTriad, ExplicitAutoIsTheSameAsOmitting) {
  auto t = train_of("micro_batch_size: 2, gradient_accumulation_steps: auto, global_batch_size: 8");
  EXPECT_EQ(*t.gradient_accumulation_steps, 4);
}

TEST(BatchTriad, IndivisibleGlobalBatchIsAnError) {
  Files files = recipe(std::string(kModel) + "train: {steps: 1, micro_batch_size: 3, global_batch_size: 10}\n");
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("global_batch_size 10 is not a multiple of micro_batch_size 3 x world_size 1"),
            std::string::npos)
      << errors[0].str();
}

TEST(BatchTriad, UndeterminedBatchIsAnError) {
  auto errors = recipe(std::string(kModel) + "train: {steps: 1, gradient_accumulation_steps: 2}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "train.gradient_accumulation_steps");
  EXPECT_NE(errors[0].message.find("undetermined"), std::string::npos);
}

TEST(Rules, AutoValuesAreResolved) {
  LoadedRecipe loaded = recipe(std::string(kModel) + "train: {steps: 1, micro_batch_size: 1}\n").load();
  EXPECT_EQ(*loaded.recipe.data.sequence_length, 32);
  EXPECT_EQ(*loaded.recipe.data.vocab_size, 64);
  EXPECT_EQ(*loaded.recipe.model.ffn_dim, 128);
  EXPECT_EQ(loaded.recipe.run.name, "r");
}

TEST(Rules, LlamaFeedForwardWidthIsTwoThirdsRounded) {
  auto r = recipe(
               "model: {arch: llama, n_head: 2, n_embd: 96}\ndata: {source: synthetic_markov}\n"
               "train: {steps: 1, micro_batch_size: 1}\n")
               .load()
               .recipe;
  EXPECT_EQ(*r.model.ffn_dim, 256);  // 2/3 * 384 = 256
}

TEST(Rules, HeadsMustDivideWidth) {
  auto errors = recipe(
                    "model: {arch: gpt, n_head: 5, n_embd: 32}\ndata: {source: synthetic_markov}\n"
                    "train: {steps: 1, micro_batch_size: 1}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].mark.str(), "r.yaml:1:28");
  EXPECT_EQ(errors[0].key, "model.n_head");
}

TEST(Rules, SequenceLongerThanContextIsAnError) {
  auto e2 = recipe(
                "model: {arch: gpt, context_length: 16, n_head: 2, n_embd: 32}\n"
                "data: {source: synthetic_markov, sequence_length: 17}\ntrain: {steps: 1, micro_batch_size: 1}\n")
                .errors();
  ASSERT_EQ(e2.size(), 1u);
  EXPECT_EQ(e2[0].key, "data.sequence_length");
  EXPECT_NE(e2[0].message.find("exceeds model.context_length 16"), std::string::npos);
}

TEST(Rules, ModelAndDataMustFit) {
  auto errors =
      recipe("model: {arch: mlp}\ndata: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "data.source");
}

TEST(Rules, WarmupLongerThanTheRunIsClampedToTheRun) {
  // The quick start shortened from the command line: warmup_steps 30 > train.steps 20.
  Files files =
      recipe(std::string(kModel) + "train: {steps: 30, micro_batch_size: 1}\nscheduler: {warmup_steps: 30}\n");
  files.overrides = {"train.steps=20"};
  Recipe r = files.load().recipe;
  EXPECT_EQ(r.train.steps, 20);
  EXPECT_EQ(r.scheduler.warmup_steps, 20);
  // The change is said, not silent.
  EXPECT_EQ(files.load().notes,
            std::vector<std::string>{"scheduler.warmup_steps 30 clamped to train.steps 20: the learning rate "
                                     "reaches optimizer.lr at the last step"});
  // A warmup that fits is kept as written, without a note.
  files.overrides = {"train.steps=40"};
  EXPECT_EQ(files.load().recipe.scheduler.warmup_steps, 30);
  EXPECT_TRUE(files.load().notes.empty());
}

TEST(Rules, MinLrAboveLrIsStillAnError) {
  auto errors = recipe(std::string(kModel) +
                       "train: {steps: 10, micro_batch_size: 1}\nscheduler: {type: cosine, warmup_steps: 11, "
                       "min_lr: 1.0}\noptimizer: {lr: 0.1}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "scheduler.min_lr");
}

TEST(Rules, KvHeadsMustDivideHeads) {
  const std::string llama =
      "model: {arch: llama, vocab_size: 64, context_length: 32, n_layer: 1, n_head: 6, n_embd: 48, kv_heads: 4}\n"
      "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n";
  auto errors = recipe(llama).errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "model.kv_heads");
  EXPECT_NE(errors[0].message.find("kv_heads 4 does not divide n_head 6"), std::string::npos) << errors[0].message;
  Files fits = recipe(llama);
  fits.overrides = {"model.kv_heads=2"};
  EXPECT_EQ(*fits.load().recipe.model.kv_heads, 2);
  fits.overrides = {"~model.kv_heads"};
  EXPECT_EQ(*fits.load().recipe.model.kv_heads, 6);  // auto: multi-head attention
  // GPT-2 has no grouped-query attention.
  Files gpt = recipe(std::string(kModel) + "train: {steps: 1, micro_batch_size: 1}\n");
  gpt.overrides = {"model.kv_heads=1"};
  auto gpt_errors = gpt.errors();
  ASSERT_EQ(gpt_errors.size(), 1u);
  EXPECT_EQ(gpt_errors[0].key, "model.kv_heads");
}

// llama3's rope scaling interpolates between two wavelengths: the high-frequency bound must be the
// shorter one. Its keys belong to rope_scaling llama3 (the factor to linear too), and to llama.
TEST(Rules, RopeScalingKeysFollowTheirType) {
  const std::string llama =
      "model: {arch: llama, vocab_size: 64, context_length: 32, n_layer: 1, n_head: 2, n_embd: 16,\n"
      "        rope_scaling: llama3, rope_low_freq_factor: 4, rope_high_freq_factor: 2}\n"
      "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n";
  auto errors = recipe(llama).errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "model.rope_high_freq_factor");
  EXPECT_NE(errors[0].message.find("rope_high_freq_factor 2 is not above rope_low_freq_factor 4"), std::string::npos)
      << errors[0].message;
  Files fits = recipe(llama);
  fits.overrides = {"model.rope_high_freq_factor=8", "model.rope_factor=32"};
  const ModelSection model = fits.load().recipe.model;
  EXPECT_EQ(model.rope_scaling, RopeScalingType::llama3);
  EXPECT_EQ(model.rope_factor, 32.0);
  EXPECT_EQ(model.rope_original_context_length, 8192);  // Llama 3.1's, by default
  Files linear = recipe(llama);
  linear.overrides = {"model.rope_scaling=linear"};
  auto linear_errors = linear.errors();
  ASSERT_FALSE(linear_errors.empty());
  EXPECT_EQ(linear_errors[0].key, "model.rope_low_freq_factor");
  Files gpt = recipe(std::string(kModel) + "train: {steps: 1, micro_batch_size: 1}\n");
  gpt.overrides = {"model.rope_scaling=linear"};
  auto gpt_errors = gpt.errors();
  ASSERT_EQ(gpt_errors.size(), 1u);
  EXPECT_EQ(gpt_errors[0].key, "model.rope_scaling");
}

TEST(Rules, NesterovNeedsMomentum) {
  auto errors = recipe(
                    "model: {arch: mlp}\ndata: {source: classification}\ntrain: {steps: 1, micro_batch_size: 1}\n"
                    "optimizer: {type: sgd, nesterov: true}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "optimizer.nesterov");
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

TEST(WorldSize, GarbageInTheEnvironmentIsAUserError) {
  ::setenv("OMPI_COMM_WORLD_SIZE", "99999999999999999999", 1);
  EXPECT_THROW(world_size_from_environment(), UserError);
  ::setenv("OMPI_COMM_WORLD_SIZE", "abc", 1);
  EXPECT_THROW(world_size_from_environment(), UserError);
  ::setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  EXPECT_EQ(world_size_from_environment().size, 4);
  ::unsetenv("OMPI_COMM_WORLD_SIZE");
  EXPECT_EQ(world_size_from_environment().size, 1);
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

TEST(Rules, MarkovOrderMustFitTheSequence) {
  auto errors =
      recipe(
          "model: {arch: gpt, n_head: 2, n_embd: 32, context_length: 8}\n"
          "data: {source: synthetic_markov, order: 4, sequence_length: 2}\ntrain: {steps: 1, micro_batch_size: 1}\n")
          .errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "data.order");
}

TEST(Rules, ClassificationEvaluationNeedsAValidationSample) {
  auto errors = recipe(
                    "model: {arch: mlp}\ndata: {source: classification, num_samples: 10, val_fraction: 0.05}\n"
                    "train: {steps: 1, micro_batch_size: 1, eval_every: 1}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "data.val_fraction");
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

const char* kPrecisionBase =
    "model: {arch: gpt, vocab_size: 64, context_length: 32, n_layer: 1, n_head: 2, n_embd: 32}\n"
    "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n";

TEST(Precision, LossScalingKeysNeedFp16AndSayWhere) {
  auto errors = recipe(std::string(kPrecisionBase) + "precision: {mode: bf16, growth_interval: 5}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "precision.growth_interval");
  EXPECT_EQ(errors[0].mark.str(), "r.yaml:4:25");
  EXPECT_NE(errors[0].message.find("precision.mode is bf16"), std::string::npos) << errors[0].message;
}

TEST(Precision, StaticScaleNeedsStaticScaling) {
  auto errors = recipe(std::string(kPrecisionBase) + "precision: {mode: fp16, static_scale: 128}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "precision.static_scale");
  EXPECT_NE(errors[0].message.find("loss_scaling is dynamic"), std::string::npos) << errors[0].message;
}

TEST(Precision, GradientsAccumulateInFp32OrTheModesType) {
  auto errors = recipe(std::string(kPrecisionBase) + "precision: {mode: bf16, accumulation_dtype: fp16}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "precision.accumulation_dtype");
  auto ok = recipe(std::string(kPrecisionBase) + "precision: {mode: fp16, accumulation_dtype: fp16}\n").load();
  EXPECT_EQ(ok.recipe.precision.accumulation_dtype, GradientDType::fp16);
}

TEST(ActivationCheckpointing, KAndOffloadApplyOnlyToTheirPolicies) {
  auto errors = recipe(std::string(kPrecisionBase) +
                       "activation_checkpointing: {policy: selective, k: 3, cpu_checkpointing: true}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].key, "activation_checkpointing.k");
  EXPECT_EQ(errors[1].key, "activation_checkpointing.cpu_checkpointing");
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

const char* kTensorBase =
    "model: {arch: gpt, vocab_size: 64, context_length: 32, n_layer: 1, n_head: 4, n_embd: 32}\n"
    "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2}\n";

// World 4 at tensor_parallel 2: two data-parallel ranks make the global batch.
TEST(TensorParallel, TheBatchCountsDataParallelRanksOnly) {
  Files files = recipe(std::string(kTensorBase) + "distributed: {tensor_parallel: 2}\n");
  files.world = WorldSize{4, "test"};
  EXPECT_EQ(*files.load().recipe.train.global_batch_size, 4);
  files.world = WorldSize{3, "test"};
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "distributed.tensor_parallel");
  EXPECT_NE(errors[0].message.find("does not divide the world size 3"), std::string::npos) << errors[0].message;
}

// Heads (query and key/value), MLP width and vocabulary split evenly, or the key is named.
TEST(TensorParallel, WhatIsSplitMustDivide) {
  auto errors = recipe(std::string(kTensorBase) + "distributed: {tensor_parallel: 8}\n").errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "model.n_head");
  EXPECT_NE(errors[0].message.find("distributed.tensor_parallel 8 does not divide model.n_head 4"), std::string::npos)
      << errors[0].message;
  errors = recipe(
               "model: {arch: llama, vocab_size: 66, context_length: 32, n_layer: 1, n_head: 4, kv_heads: 2, n_embd: "
               "32}\ndata: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2}\n"
               "distributed: {tensor_parallel: 4}\n")
               .errors();
  ASSERT_EQ(errors.size(), 2u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "model.vocab_size");
  EXPECT_EQ(errors[1].key, "model.kv_heads");
}

// `recipe_text` plus each of the sections the layout does not run with yet (the GPU) is refused,
// naming its key and saying so (`message`), never run some other way; LoRA runs with it.
void expect_refused_with_layout(const std::string& recipe_text, const std::string& message) {
  EXPECT_NO_THROW(recipe(recipe_text + "lora: {rank: 4}\n").load()) << "LoRA with " << recipe_text;
  for (const auto& [section, key] : {std::pair<std::string, std::string>{"run: {device: cuda}", "run.device"}}) {
    auto errors = recipe(recipe_text + section + "\n").errors();
    ASSERT_FALSE(errors.empty()) << section;
    bool named = false;
    for (const auto& e : errors) named |= e.key == key && e.message.find(message) != std::string::npos;
    EXPECT_TRUE(named) << section << "\n" << render_diagnostics(errors);
  }
}

TEST(TensorParallel, WhatDoesNotRunSplitYetIsRefused) {
  expect_refused_with_layout(std::string(kTensorBase) + "distributed: {tensor_parallel: 2}\n",
                             "does not run with tensor parallelism yet");
}

const char* kPipelineBase =
    "model: {arch: llama, vocab_size: 64, context_length: 32, n_layer: 2, n_head: 2, n_embd: 32}\n"
    "data: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 2, gradient_accumulation_steps: 4}\n";

// World 4 at pipeline_parallel 2: two data-parallel ranks; more stages than blocks is refused.
TEST(PipelineParallel, StagesCountAgainstTheWorldAndTheBlocks) {
  Files files = recipe(std::string(kPipelineBase) + "distributed: {pipeline_parallel: 2}\n");
  files.world = WorldSize{4, "test"};
  EXPECT_EQ(*files.load().recipe.train.global_batch_size, 16);
  auto errors = recipe(std::string(kPipelineBase) + "distributed: {pipeline_parallel: 3}\n").errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "distributed.pipeline_parallel");
  EXPECT_NE(errors[0].message.find("needs a block per stage at least, and model.n_layer is 2"), std::string::npos)
      << errors[0].message;
}

// distributed.pipeline_blocks: one whole number of blocks per stage, summing to n_layer; refused by
// key otherwise, and without stages to cut.
TEST(PipelineParallel, BlocksPerStageMustCutTheModel) {
  EXPECT_NO_THROW(
      recipe(std::string(kPipelineBase) + "distributed: {pipeline_parallel: 2, pipeline_blocks: [1, 1]}\n").load());
  for (const char* blocks : {"[2]", "[1, 2]", "[0.5, 1.5]", "[1, 1, 0]"}) {
    auto errors =
        recipe(std::string(kPipelineBase) + "distributed: {pipeline_parallel: 2, pipeline_blocks: " + blocks + "}\n")
            .errors();
    ASSERT_FALSE(errors.empty()) << blocks;
    EXPECT_EQ(errors[0].key, "distributed.pipeline_blocks") << blocks << "\n" << render_diagnostics(errors);
  }
  auto errors = recipe(std::string(kPipelineBase) + "distributed: {pipeline_blocks: [2]}\n").errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_NE(errors[0].message.find("but distributed.pipeline_parallel is 1"), std::string::npos) << errors[0].message;
}

TEST(PipelineParallel, WhatDoesNotRunInStagesYetIsRefused) {
  expect_refused_with_layout(std::string(kPipelineBase) + "distributed: {pipeline_parallel: 2}\n",
                             "does not run with pipeline parallelism yet");
}

}  // namespace
}  // namespace engine::recipe::testing
