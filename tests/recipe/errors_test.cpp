// One test per kind of recipe mistake: each asserts the exact file:line:column, the key path and
// the gist of the message a user sees.
#include <filesystem>
#include <fstream>

#include "../temp_dir.h"
#include "recipe_test_util.h"

namespace engine::recipe::testing {
namespace {

void expect_single(const std::vector<Diagnostic>& errors, const std::string& where, const std::string& key,
                   const std::string& message_part) {
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].mark.str(), where);
  EXPECT_EQ(errors[0].key, key);
  EXPECT_NE(errors[0].str().find(message_part), std::string::npos) << errors[0].str();
}

TEST(RecipeErrors, UnknownKeySuggestsTheClosestSibling) {
  auto errors = recipe(std::string(kValidRecipe) + "  log_evry: 5\n").errors();
  expect_single(errors, "r.yaml:13:3", "train.log_evry", "did you mean 'train.log_every'?");
}

TEST(RecipeErrors, UnknownKeyThatBelongsToAnotherSectionNamesIt) {
  auto errors = recipe(std::string(kValidRecipe) + "  lr: 0.1\n").errors();
  expect_single(errors, "r.yaml:13:3", "train.lr", "did you mean 'optimizer.lr'?");
}

TEST(RecipeErrors, UnknownSectionSuggestsTheClosestSection) {
  auto errors = recipe(std::string(kValidRecipe) + "optimiser:\n  lr: 0.1\n").errors();
  expect_single(errors, "r.yaml:13:1", "optimiser", "did you mean 'optimizer'?");
}

TEST(RecipeErrors, MisspeltTelemetryKeySuggestsTheKey) {
  auto errors = recipe(std::string(kValidRecipe) + "telemetry:\n  trace_step: 2\n").errors();
  expect_single(errors, "r.yaml:14:3", "telemetry.trace_step", "did you mean 'telemetry.trace_steps'?");
}

TEST(RecipeErrors, WrongTypeNamesExpectedAndFound) {
  auto errors = recipe(std::string(kValidRecipe) + "  log_every: often\n").errors();
  expect_single(errors, "r.yaml:13:14", "train.log_every", "expected an integer >= 1, found 'often'");
}

TEST(RecipeErrors, QuotedNumberIsAStringWithAHint) {
  auto errors = recipe(std::string(kValidRecipe) + "  log_every: \"5\"\n").errors();
  expect_single(errors, "r.yaml:13:14", "train.log_every", "remove the quotes");
}

TEST(RecipeErrors, ExponentForAnIntegerSuggestsTheInteger) {
  auto errors = recipe(std::string(kValidRecipe) + "  log_every: 1e3\n").errors();
  expect_single(errors, "r.yaml:13:14", "train.log_every", "write 1000");
}

TEST(RecipeErrors, IntegerOverflowIsReported) {
  auto errors = recipe(std::string(kValidRecipe) + "  log_every: 99999999999999999999\n").errors();
  expect_single(errors, "r.yaml:13:14", "train.log_every", "64-bit");
}

TEST(RecipeErrors, OutOfRangeNumberShowsTheRange) {
  auto range = recipe(std::string(kValidRecipe) + "optimizer:\n  lr: -0.1\n").errors();
  expect_single(range, "r.yaml:14:7", "optimizer.lr", "expected a number > 0, found '-0.1'");
}

TEST(RecipeErrors, HalfOpenRangeIsExplained) {
  auto dropout = recipe(std::string(kValidRecipe) + "optimizer:\n  betas: [0.9, 1.0]\n").errors();
  expect_single(dropout, "r.yaml:14:10", "optimizer.betas", "each in [0, 1), found '1.0' among the items");
}

TEST(RecipeErrors, BadEnumValueSuggestsTheClosestChoice) {
  auto errors = recipe(std::string(kValidRecipe) + "scheduler:\n  type: cosin\n").errors();
  expect_single(errors, "r.yaml:14:9", "scheduler.type",
                "one of constant, linear, cosine, found 'cosin'; did you mean 'cosine'?");
}

TEST(RecipeErrors, AmbiguousYamlBooleanIsRefused) {
  auto yes = recipe(std::string(kValidRecipe) + "optimizer:\n  decay_norms_and_biases: yes\n").errors();
  expect_single(yes, "r.yaml:14:27", "optimizer.decay_norms_and_biases", "write true or false");
}

TEST(RecipeErrors, DuplicateKeyPointsAtBothPlaces) {
  auto errors = recipe(std::string(kValidRecipe) + "  steps: 20\n").errors();
  expect_single(errors, "r.yaml:13:3", "", "duplicate key 'steps' (first written at r.yaml:11:3)");
}

TEST(RecipeErrors, DuplicateSectionIsReported) {
  auto errors = recipe(std::string(kValidRecipe) + "train:\n  steps: 5\n").errors();
  expect_single(errors, "r.yaml:13:1", "", "duplicate key 'train'");
}

TEST(RecipeErrors, MissingRequiredKeyPointsAtItsSection) {
  auto errors = recipe("model: {arch: gpt}\ndata: {source: text}\ntrain: {steps: 5, micro_batch_size: 2}\n").errors();
  expect_single(errors, "r.yaml:2:1", "data.path", "missing required key (a file path)");
}

TEST(RecipeErrors, MissingRequiredSectionPointsAtTheDocument) {
  auto errors = recipe("model: {arch: gpt}\ndata: {source: synthetic_markov}\n").errors();
  expect_single(errors, "r.yaml:1:1", "train.steps", "missing required key");
}

TEST(RecipeErrors, KeyOfAnotherVariantIsRefused) {
  auto errors = recipe(std::string(kValidRecipe) + "optimizer:\n  momentum: 0.9\n").errors();
  expect_single(errors, "r.yaml:14:3", "optimizer.momentum", "does not apply when optimizer.type is adamw");
}

TEST(RecipeErrors, ErrorInABasePointsIntoTheBase) {
  Files files{{{"common/base.yaml", "model:\n  arch: gpt\n  n_head: many\n"},
               {"r.yaml",
                "base: common/base.yaml\ndata: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n"}},
              {},
              {}};
  auto errors = files.errors();
  expect_single(errors, "common/base.yaml:3:11", "model.n_head", "common/base.yaml is a base of r.yaml:1:7");
}

TEST(RecipeErrors, OverrideErrorPointsAtTheCommandLine) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.steps=20", "train.log_every=-3"};
  auto errors = files.errors();
  expect_single(errors, "<command line>:2:17", "train.log_every", "expected an integer >= 1, found '-3'");
}

TEST(RecipeErrors, OverrideOfAnUnknownKeyIsAnUnknownKey) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.stepz=20"};
  expect_single(files.errors(), "<command line>:1:1", "train.stepz", "did you mean 'train.steps'?");
}

TEST(RecipeErrors, MalformedOverrideIsExplained) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.steps"};
  expect_single(files.errors(), "<command line>:1:1", "", "must look like section.key=value or ~section.key");
}

TEST(RecipeErrors, DeletingAnUnknownKeyIsRefused) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"~optimizer.learning_rate"};
  expect_single(files.errors(), "<command line>:1:1", "optimizer.learning_rate", "cannot delete an unknown key");
}

TEST(RecipeErrors, YamlSyntaxErrorHasItsPosition) {
  auto errors = recipe("model:\n  arch: [gpt\ntrain: {steps: 1}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].mark.origin->name, "r.yaml");
  EXPECT_GT(errors[0].mark.line, 1);
  EXPECT_NE(errors[0].message.find("invalid YAML"), std::string::npos) << errors[0].str();
}

TEST(RecipeErrors, InconsistentBatchTriadNamesAllValuesAndTheWorldSizeSource) {
  Files files = recipe(std::string(kValidRecipe) + "  gradient_accumulation_steps: 2\n  global_batch_size: 12\n");
  files.world = WorldSize{2, "--world-size on the command line"};
  auto errors = files.errors();
  expect_single(errors, "r.yaml:14:22", "train.global_batch_size",
                "global_batch_size 12 != micro_batch_size 4 x gradient_accumulation_steps 2 x world_size 2 (= 16)");
  EXPECT_NE(errors[0].str().find("world_size 2 comes from --world-size on the command line"), std::string::npos);
}

TEST(RecipeErrors, MissingDataFileIsReportedRelativeToTheRecipe) {
  const ::engine::testing::TempDir scratch("errors");
  const auto& dir = scratch.path();
  auto path = dir / "r.yaml";
  std::ofstream(path) << "model: {arch: gpt, vocab_size: 256}\ndata:\n  source: text\n  path: missing.txt\n"
                         "train: {steps: 1, micro_batch_size: 1}\n";
  try {
    load_recipe(path);
    FAIL() << "loaded";
  } catch (const RecipeError& e) {
    expect_single(e.diagnostics(), path.string() + ":4:9", "data.path",
                  "file not found: " + (dir / "missing.txt").string());
  }
}

TEST(RecipeErrors, AllErrorsAreReportedAtOnceInReadingOrder) {
  auto errors = recipe(
                    "model:\n  arch: gtp\n  n_lyer: 2\n"
                    "data:\n  source: synthetic_markov\n  order: 9\n"
                    "train:\n  steps: 0\n")
                    .errors();
  ASSERT_EQ(errors.size(), 4u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].mark.str(), "r.yaml:2:9");  // arch: did you mean gpt
  EXPECT_NE(errors[0].message.find("did you mean 'gpt'"), std::string::npos);
  EXPECT_EQ(errors[1].mark.str(), "r.yaml:3:3");   // n_lyer
  EXPECT_EQ(errors[2].mark.str(), "r.yaml:6:10");  // order out of range
  EXPECT_EQ(errors[3].mark.str(), "r.yaml:8:10");  // steps 0
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

TEST(RecipeErrors, RuleErrorsAreReportedTogetherWithValidationErrors) {
  auto errors = recipe(
                    "model: {arch: gpt, n_head: 5, n_embd: 32}\ndata: {source: synthetic_markov}\n"
                    "train: {steps: 1, micro_batch_size: 1, log_every: 0}\n")
                    .errors();
  ASSERT_EQ(errors.size(), 2u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "model.n_head");  // a rule: n_embd % n_head
  EXPECT_EQ(errors[1].key, "train.log_every");
}

TEST(RecipeErrors, RulesSkipSectionsThatFailedValidation) {
  // micro_batch_size is rejected, so the batch rule must not also claim the batch is undetermined.
  auto errors = recipe(std::string(kValidRecipe)
                           .replace(std::string(kValidRecipe).find("micro_batch_size: 4"), 19, "micro_batch_size: -4"))
                    .errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "train.micro_batch_size");
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

TEST(RecipeErrors, DuplicateKeysAreReportedWithTheOtherErrors) {
  auto errors = recipe(std::string(kValidRecipe) + "run: {seed: 1, seed: 2, name: [x]}\n").errors();
  ASSERT_EQ(errors.size(), 2u) << render_diagnostics(errors);
  EXPECT_NE(errors[0].message.find("duplicate key 'seed'"), std::string::npos);
  EXPECT_EQ(errors[1].key, "run.name");
}

TEST(RecipeErrors, AMalformedOverrideDoesNotHideOtherErrors) {
  Files files = recipe(std::string(kValidRecipe) + "  log_every: 0\n");
  files.overrides = {"bad", "train.steps=x"};
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 3u) << render_diagnostics(errors);
}

TEST(RecipeErrors, AnInvalidSelectorDoesNotAlsoRejectItsVariantKeys) {
  auto errors = recipe(std::string(kValidRecipe) + "scheduler: {type: lin, min_lr: 0.0}\n").errors();
  ASSERT_EQ(errors.size(), 1u) << render_diagnostics(errors);
  EXPECT_EQ(errors[0].key, "scheduler.type");
}

TEST(RecipeErrors, ColumnsCountCharactersNotBytes) {
  auto errors = recipe(std::string(kValidRecipe) + "run: {name: éééé, seed: x}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].mark.str(), "r.yaml:13:25");
}

TEST(RecipeErrors, LongValuesAreShortenedWithoutSplittingCharacters) {
  auto errors = recipe(std::string(kValidRecipe) + "run: {seed: " + std::string(38, 'a') + "ééé}\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find(std::string(38, 'a') + "éé..."), std::string::npos) << errors[0].message;
}

TEST(RecipeErrors, HugeValuesHitTheEngineLimitInsteadOfOverflowing) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.micro_batch_size=4611686018427387904", "model.n_embd=4611686018427387904"};
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 2u) << render_diagnostics(errors);
  EXPECT_NE(errors[0].message.find("above this engine's limit"), std::string::npos);
}

}  // namespace
}  // namespace engine::recipe::testing
