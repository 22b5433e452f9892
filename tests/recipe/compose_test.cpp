// Composition: bases deep-merge maps and replace lists, cycles are caught, overrides set and delete.
#include "recipe/compose.h"
#include "recipe_test_util.h"

namespace engine::recipe::testing {
namespace {

TEST(Compose, BaseIsMergedUnderTheRecipeDeeply) {
  Files files{{{"base.yaml",
                "model: {arch: gpt, n_layer: 6, n_head: 2, n_embd: 32}\noptimizer: {lr: 0.01, betas: [0.8, 0.9]}\n"},
               {"r.yaml",
                "base: base.yaml\nmodel: {n_layer: 3}\ndata: {source: synthetic_markov}\n"
                "train: {steps: 5, micro_batch_size: 2}\noptimizer: {betas: [0.5, 0.6]}\n"}},
              {},
              {}};
  Recipe r = files.load().recipe;
  EXPECT_EQ(r.model.n_layer, 3);                                  // recipe wins
  EXPECT_EQ(r.model.n_head, 2);                                   // kept from the base
  EXPECT_DOUBLE_EQ(r.optimizer.lr, 0.01);                         // sibling of a replaced key survives
  EXPECT_EQ(r.optimizer.betas, (std::vector<double>{0.5, 0.6}));  // lists are replaced whole
}

TEST(Compose, ListOfBasesMergesInOrder) {
  Files files{{{"a.yaml", "model: {arch: gpt, n_layer: 1}\ntrain: {steps: 7}\n"},
               {"b.yaml", "model: {n_layer: 2}\n"},
               {"dir/r.yaml",
                "base: [../a.yaml, ../b.yaml]\ndata: {source: synthetic_markov}\ntrain: {micro_batch_size: 1}\n"}},
              {},
              {}};
  Recipe r = files.load("dir/r.yaml").recipe;
  EXPECT_EQ(r.model.n_layer, 2);
  EXPECT_EQ(r.train.steps, 7);
}

TEST(Compose, NestedBasesResolveRelativeToEachFile) {
  Files files{{{"common/model.yaml", "model: {arch: llama, n_head: 2, n_embd: 32}\n"},
               {"common/all.yaml", "base: model.yaml\ndata: {source: synthetic_markov}\n"},
               {"recipes/r.yaml", "base: ../common/all.yaml\ntrain: {steps: 1, micro_batch_size: 1}\n"}},
              {},
              {}};
  EXPECT_EQ(files.load("recipes/r.yaml").recipe.model.arch, Arch::llama);
}

TEST(Compose, CycleIsReportedWithTheChain) {
  Files files{{{"a.yaml", "base: b.yaml\n"}, {"b.yaml", "base: a.yaml\n"}, {"r.yaml", "base: a.yaml\n"}}, {}, {}};
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("bases form a cycle: a.yaml -> b.yaml -> a.yaml"), std::string::npos)
      << errors[0].str();
  EXPECT_EQ(errors[0].mark.str(), "b.yaml:1:7");
}

TEST(Compose, SelfBaseIsACycle) {
  auto errors = recipe("base: r.yaml\n").errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("cycle"), std::string::npos);
}

TEST(Compose, MissingBaseIsReportedAtTheBaseKey) {
  auto errors = recipe(std::string("base: [nope.yaml]\n") + kValidRecipe).errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].mark.str(), "r.yaml:1:8");
  EXPECT_NE(errors[0].message.find("nope.yaml: no such file"), std::string::npos);
}

TEST(Compose, BaseMustBeAPathOrList) {
  auto errors = recipe(std::string("base: {a: 1}\n") + kValidRecipe).errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].key, "base");
}

TEST(Compose, OverridesSetValuesParsedAsYaml) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.steps=99", "optimizer.betas=[0.5, 0.75]", "scheduler={type: cosine, min_lr: 0.0}"};
  Recipe r = files.load().recipe;
  EXPECT_EQ(r.train.steps, 99);
  EXPECT_EQ(r.optimizer.betas, (std::vector<double>{0.5, 0.75}));
  EXPECT_EQ(r.scheduler.type, SchedulerType::cosine);
}

TEST(Compose, LaterOverrideWins) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.steps=1", "train.steps=2"};
  EXPECT_EQ(files.load().recipe.train.steps, 2);
}

TEST(Compose, DeleteOverrideRestoresTheDefault) {
  Files files = recipe(std::string(kValidRecipe) + "  log_every: 3\n");
  files.overrides = {"~train.log_every"};
  EXPECT_EQ(files.load().recipe.train.log_every, 10);
}

TEST(Compose, DeleteOfAnAbsentKnownKeyIsHarmless) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"~scheduler.min_lr", "~optimizer"};
  EXPECT_EQ(files.load().recipe.scheduler.min_lr, 0.0);
}

TEST(Compose, OverrideCannotReachIntoAScalar) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"train.steps.x=1"};
  auto errors = files.errors();
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("cannot reach into 'train.steps'"), std::string::npos);
}

TEST(Compose, OverrideCannotChangeBases) {
  Files files = recipe(kValidRecipe);
  files.overrides = {"base=other.yaml"};
  EXPECT_EQ(files.errors().at(0).key, "base");
}

TEST(Compose, ValuesKeepTheMarkOfTheFileTheyCameFrom) {
  Files files{
      {{"base.yaml", "model:\n  arch: gpt\n  n_head: 2\n  n_embd: 32\n"},
       {"r.yaml", "base: base.yaml\ndata: {source: synthetic_markov}\ntrain: {steps: 1, micro_batch_size: 1}\n"}},
      {"model.n_layer=3"},
      {}};
  LoadedRecipe loaded = files.load();
  EXPECT_EQ(loaded.marks.at("model.n_head").str(), "base.yaml:3:11");
  EXPECT_EQ(loaded.marks.at("train.steps").str(), "r.yaml:3:16");
  EXPECT_EQ(loaded.marks.at("model.n_layer").str(), "<command line>:1:15");
}

TEST(Compose, DeepMergeReplacesNonMaps) {
  auto origin = std::make_shared<Origin>(Origin{"x", "", nullptr});
  YamlNode bottom = parse_yaml("a: {b: 1, c: [1, 2]}\nd: 4\n", origin);
  deep_merge(bottom, parse_yaml("a: {c: [3]}\nd: {e: 5}\n", origin));
  EXPECT_EQ(bottom.find("a")->find("b")->scalar, "1");
  ASSERT_EQ(bottom.find("a")->find("c")->items.size(), 1u);
  EXPECT_TRUE(bottom.find("d")->is_map());
}

}  // namespace
}  // namespace engine::recipe::testing

namespace engine::recipe::testing {
namespace {

TEST(Compose, BasesThatFanOutStopAtTheFileLimit) {
  Files files;
  for (int i = 1; i < 16; ++i) {
    std::string next = "l" + std::to_string(i + 1) + ".yaml";
    files.files["l" + std::to_string(i) + ".yaml"] = "base: [" + next + ", " + next + ", " + next + ", " + next + "]\n";
  }
  files.files["l16.yaml"] = "model: {arch: gpt}\n";
  try {
    files.load("l1.yaml");
    FAIL() << "loaded";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 64 files"), std::string::npos) << e.what();
  }
}

TEST(Compose, DiamondBasesAreNotACycle) {
  Files files{{{"d.yaml", "model: {arch: gpt, n_head: 2, n_embd: 32}\n"},
               {"b.yaml", "base: d.yaml\n"},
               {"c.yaml", "base: d.yaml\ndata: {source: synthetic_markov}\n"},
               {"r.yaml", "base: [b.yaml, c.yaml]\ntrain: {steps: 1, micro_batch_size: 1}\n"}},
              {},
              {}};
  EXPECT_EQ(files.load().recipe.model.n_head, 2);
}

TEST(Compose, AnEmptySectionDoesNotEraseTheBase) {
  Files files{{{"base.yaml", std::string(kValidRecipe) + "optimizer: {lr: 0.1}\n"},
               {"r.yaml", "base: base.yaml\noptimizer:\n  # lr: 0.5\n"}},
              {},
              {}};
  EXPECT_DOUBLE_EQ(files.load().recipe.optimizer.lr, 0.1);
}

TEST(Compose, OverrideIntoAnEmptySection) {
  Files files = recipe(std::string(kValidRecipe) + "run:\n");
  files.overrides = {"run.seed=3"};
  EXPECT_EQ(files.load().recipe.run.seed, 3);
}

}  // namespace
}  // namespace engine::recipe::testing
