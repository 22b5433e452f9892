// Wrap policy: units and their names per policy, the parameter layout of merged units, bit-identical
// training under every policy (with and without activation checkpointing), and checkpointing
// segments that follow the merged units.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "../equivalence/run_util.h"
#include "graph/autodiff.h"
#include "graph/precision.h"
#include "graph/wrap.h"

namespace engine {
namespace {

using testing::quickstart;
using Kind = WrapPolicySpec::Kind;

recipe::LoadedRecipe load(const char* file, std::vector<std::string> overrides) {
  recipe::LoadOptions options;
  options.overrides = std::move(overrides);
  return recipe::load_recipe(std::filesystem::path(ENGINE_SOURCE_DIR) / "recipes" / file, options);
}

// The forward graph of a recipe (the quick start unless `file` names another), with `spec` applied.
ModelGraph build(const std::vector<std::string>& overrides, const WrapPolicySpec& spec,
                 const char* file = "quickstart.yaml") {
  auto loaded = load(file, overrides);
  ModelGraph model = build_model(loaded.recipe, 2, 1.0);
  apply_wrap_policy(model.graph, spec);
  return model;
}

std::vector<std::string> names(const Graph& g) {
  std::vector<std::string> out;
  for (const Unit& u : g.units()) out.push_back(u.name);
  return out;
}

struct Arch {
  const char* override;
  std::string block;  // a block unit's name without its index
};
const Arch kArchs[] = {{"model.arch=gpt", "h."}, {"model.arch=llama", "layers."}};

// `groups` lists the builder's units that each merged unit holds. Checks the merged graph against
// the graph as built: unit names, sizes and block flags; every node in the unit holding its old
// unit; every parameter's name, shape, and position in the concatenation of all unit buffers.
void expect_merged(const Graph& built, const Graph& merged, const std::vector<std::vector<std::string>>& groups) {
  ASSERT_EQ(merged.units().size(), groups.size());
  std::map<std::string, int> holder;  // builder's unit name -> merged unit index
  std::map<std::string, int64_t> built_numel;
  std::map<std::string, bool> built_block;
  for (const Unit& u : built.units()) built_numel[u.name] = u.numel, built_block[u.name] = u.block;
  for (size_t m = 0; m < groups.size(); ++m) {
    const Unit& unit = merged.units()[m];
    const std::string expected_name = groups[m].size() == 1 ? groups[m][0] : groups[m].front() + "-" + groups[m].back();
    EXPECT_EQ(unit.name, expected_name);
    int64_t numel = 0;
    bool block = false;
    for (const std::string& old : groups[m]) {
      holder[old] = int(m);
      numel += built_numel.at(old);
      block = block || built_block.at(old);
    }
    EXPECT_EQ(unit.numel, numel) << unit.name;
    EXPECT_EQ(unit.block, block) << unit.name;
  }
  EXPECT_EQ(merged.param_count(), built.param_count());

  ASSERT_EQ(merged.nodes().size(), built.nodes().size());
  for (size_t i = 0; i < built.nodes().size(); ++i) {
    const int old = built.nodes()[i].unit;
    EXPECT_EQ(merged.nodes()[i].unit, old < 0 ? -1 : holder.at(built.units()[size_t(old)].name))
        << built.nodes()[i].name;
  }

  auto start = [](const Graph& g) {  // where each unit's buffer starts in the concatenation
    std::vector<int64_t> s{0};
    for (const Unit& u : g.units()) s.push_back(s.back() + u.numel);
    return s;
  };
  const std::vector<int64_t> built_start = start(built), merged_start = start(merged);
  ASSERT_EQ(merged.params().size(), built.params().size());
  std::vector<std::vector<std::pair<int64_t, int64_t>>> spans(merged.units().size());
  for (size_t i = 0; i < built.params().size(); ++i) {
    const Param &a = built.params()[i], &b = merged.params()[i];
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(merged.value(b.value).shape, built.value(a.value).shape) << a.name;
    EXPECT_EQ(merged.value(b.value).name, a.name);
    EXPECT_EQ(b.unit, holder.at(built.units()[size_t(a.unit)].name)) << a.name;
    EXPECT_EQ(merged_start[size_t(b.unit)] + b.offset, built_start[size_t(a.unit)] + a.offset) << a.name;
    if (!spans[size_t(b.unit)].empty()) {
      EXPECT_GT(b.offset, spans[size_t(b.unit)].back().first) << a.name;
    }
    spans[size_t(b.unit)].push_back({b.offset, b.offset + merged.value(b.value).shape.numel()});
  }
  // The parameters of each merged unit, in order, tile its buffer exactly.
  for (size_t m = 0; m < spans.size(); ++m) {
    int64_t at = 0;
    for (auto [begin, end] : spans[m]) {
      EXPECT_EQ(begin, at) << merged.units()[m].name;
      at = end;
    }
    EXPECT_EQ(at, merged.units()[m].numel) << merged.units()[m].name;
  }
}

TEST(WrapPolicy, BlockKeepsTheUnitsAsBuilt) {
  for (const Arch& arch : kArchs) {
    const std::vector<std::string> o{arch.override, "model.n_layer=4"};
    ModelGraph built = build(o, {Kind::block, 0});
    const std::string b = arch.block;
    EXPECT_EQ(names(built.graph), (std::vector<std::string>{"embeddings", b + "0", b + "1", b + "2", b + "3", "head"}));
    expect_merged(built.graph, built.graph, {{"embeddings"}, {b + "0"}, {b + "1"}, {b + "2"}, {b + "3"}, {"head"}});
  }
}

TEST(WrapPolicy, ModelIsOneUnit) {
  for (const Arch& arch : kArchs) {
    const std::vector<std::string> o{arch.override, "model.n_layer=4"};
    ModelGraph built = build(o, {Kind::block, 0}), merged = build(o, {Kind::model, 0});
    const std::string b = arch.block;
    expect_merged(built.graph, merged.graph, {{"embeddings", b + "0", b + "1", b + "2", b + "3", "head"}});
    EXPECT_EQ(merged.graph.units()[0].name, "embeddings-head");
  }
}

TEST(WrapPolicy, SizeMergesConsecutiveUnitsUpToTheLimit) {
  for (const Arch& arch : kArchs) {
    const std::vector<std::string> o{arch.override, "model.n_layer=4"};
    ModelGraph built = build(o, {Kind::block, 0});
    const std::vector<Unit>& u = built.graph.units();
    const std::string b = arch.block;
    const int64_t embeddings = u[0].numel, block = u[1].numel, head = u[5].numel;
    // The expectations below hold for the quick start's proportions.
    ASSERT_LT(embeddings, block);
    ASSERT_LT(head, block);
    SCOPED_TRACE(arch.override);

    // Two blocks' worth: the embeddings join the first block, the head the last.
    expect_merged(built.graph, build(o, {Kind::size, 2 * block}).graph,
                  {{"embeddings", b + "0"}, {b + "1", b + "2"}, {b + "3", "head"}});
    // One block's worth: nothing fits beside a block, so every unit stays alone.
    expect_merged(built.graph, build(o, {Kind::size, block}).graph,
                  {{"embeddings"}, {b + "0"}, {b + "1"}, {b + "2"}, {b + "3"}, {"head"}});
    // Units larger than the limit stay alone (never split); the small ones still merge.
    expect_merged(built.graph, build(o, {Kind::size, 1}).graph,
                  {{"embeddings"}, {b + "0"}, {b + "1"}, {b + "2"}, {b + "3"}, {"head"}});
    expect_merged(built.graph, build(o, {Kind::size, embeddings + block}).graph,
                  {{"embeddings", b + "0"}, {b + "1"}, {b + "2"}, {b + "3", "head"}});
    // Everything fits: the whole model.
    expect_merged(built.graph, build(o, {Kind::size, built.graph.param_count()}).graph,
                  {{"embeddings", b + "0", b + "1", b + "2", b + "3", "head"}});
  }
}

TEST(WrapPolicy, MlpLayersMerge) {
  const std::vector<std::string> o{"model.n_layer=3"};
  const char* file = "examples/mlp-classifier.yaml";
  ModelGraph built = build(o, {Kind::block, 0}, file);
  ASSERT_EQ(names(built.graph), (std::vector<std::string>{"layers.0", "layers.1", "layers.2", "head"}));
  expect_merged(built.graph, build(o, {Kind::model, 0}, file).graph, {{"layers.0", "layers.1", "layers.2", "head"}});
  const int64_t hidden = built.graph.units()[1].numel;
  expect_merged(built.graph, build(o, {Kind::size, 2 * hidden}, file).graph,
                {{"layers.0", "layers.1"}, {"layers.2", "head"}});
}

// A few optimizer steps of a session compiled with the wrap pass: losses, gradient norms, weights.
testing::Run train(const std::vector<std::string>& overrides, int64_t steps = 4) {
  return testing::run(quickstart(overrides).recipe, steps);
}

// The layout of the concatenated buffers does not change, so neither does any number that
// matters: the optimizer state and the initialisation stream run in the same order (the gradient
// norm's block partial sums follow the units, see below).
TEST(WrapPolicy, TrainingIsBitIdenticalUnderEveryPolicy) {
  const std::vector<std::string> base{"model.n_layer=3", "model.dropout=0.1", "train.micro_batch_size=4",
                                      "train.gradient_clipping=0.5"};
  const testing::Run reference = train(base);
  ASSERT_EQ(reference.units, 5u);
  for (std::vector<std::string> policy :
       std::vector<std::vector<std::string>>{{"distributed.wrap_policy=size", "distributed.wrap_size=60000"},
                                             {"distributed.wrap_policy=size", "distributed.wrap_size=110000"},
                                             {"distributed.wrap_policy=model"}}) {
    std::vector<std::string> overrides = base;
    overrides.insert(overrides.end(), policy.begin(), policy.end());
    const testing::Run t = train(overrides);
    const std::string what = policy.back();
    EXPECT_LT(t.units, reference.units) << what << " merged nothing";
    EXPECT_EQ(t.losses, reference.losses) << what;
    // The norm's partial sums run over kShardBlock-element blocks of each unit (dist/shard_layout.h),
    // so regrouping units may move its last bits; the clip factor and the weights do not move.
    ASSERT_EQ(t.grad_norms.size(), reference.grad_norms.size());
    for (size_t i = 0; i < t.grad_norms.size(); ++i)
      EXPECT_NEAR(t.grad_norms[i], reference.grad_norms[i], 1e-12 * reference.grad_norms[i]) << what;
    EXPECT_TRUE(t.weights == reference.weights) << what << ": weights differ";
  }
}

// Checkpointing segments follow the merged units; recompute stays exact, also for a unit that
// holds the head (whose logits the loss overwrites with their gradient: never recomputed).
TEST(WrapPolicy, CheckpointingOnMergedUnitsIsBitIdenticalToNone) {
  for (const char* arch : {"model.arch=gpt", "model.arch=llama"}) {
    std::vector<std::string> base{arch, "model.n_layer=3", "train.micro_batch_size=4"};
    if (std::string(arch) == "model.arch=gpt") base.push_back("model.dropout=0.1");
    const testing::Run reference = train(base, 3);
    for (std::vector<std::string> wrap : std::vector<std::vector<std::string>>{
             {"distributed.wrap_policy=model"}, {"distributed.wrap_policy=size", "distributed.wrap_size=110000"}})
      for (std::vector<std::string> policy : std::vector<std::vector<std::string>>{
               {"activation_checkpointing.policy=full"},
               {"activation_checkpointing.policy=full", "activation_checkpointing.cpu_checkpointing=true"},
               {"activation_checkpointing.policy=every_k", "activation_checkpointing.k=2"},
               {"activation_checkpointing.policy=selective"}}) {
        std::vector<std::string> overrides = base;
        overrides.insert(overrides.end(), wrap.begin(), wrap.end());
        overrides.insert(overrides.end(), policy.begin(), policy.end());
        const std::string what = std::string(arch) + " " + wrap.back() + " " + policy.back();
        ASSERT_GT(compile_step(quickstart(overrides).recipe).recompute.cloned_nodes, 0)
            << what << " recomputes nothing";
        const testing::Run t = train(overrides, 3);
        EXPECT_EQ(t.losses, reference.losses) << what;
        EXPECT_TRUE(t.weights == reference.weights) << what << ": weights differ";
      }
  }
}

// Which forward layer (its unit as built: "h.1") each recompute clone comes from, in node order.
std::vector<std::string> recomputed_blocks(const Graph& g) {
  std::vector<std::string> out;
  for (const Node& n : g.nodes()) {
    if (!n.name.ends_with(" (recompute)") || !n.name.starts_with("h.")) continue;
    out.push_back(n.name.substr(0, n.name.find('.', 2)));
  }
  return out;
}

TEST(WrapPolicy, FullCheckpointingRecomputesAMergedUnitAsOneSegment) {
  // A vocabulary large enough that the embeddings do not fit beside a block: units h.0-h.1 and h.2-h.3.
  std::vector<std::string> base{"model.n_layer=4", "model.vocab_size=1024", "activation_checkpointing.policy=full"};
  CompiledStep blocks = compile_step(quickstart(base).recipe);
  const int64_t block = blocks.model.graph.units()[1].numel;
  ASSERT_GT(blocks.model.graph.units()[0].numel, block);
  base.push_back("distributed.wrap_policy=size");
  base.push_back("distributed.wrap_size=" + std::to_string(2 * block));
  CompiledStep pairs = compile_step(quickstart(base).recipe);
  ASSERT_EQ(names(pairs.model.graph), (std::vector<std::string>{"embeddings", "h.0-h.1", "h.2-h.3", "head"}));

  EXPECT_EQ(blocks.recompute.segments, 4);
  EXPECT_EQ(pairs.recompute.segments, 2);
  // Each pair is recomputed in one run, just before its backward: h.2 and h.3 first, then h.0 and h.1.
  const std::vector<std::string> order = recomputed_blocks(pairs.model.graph);
  std::vector<std::string> runs;
  for (const std::string& b : order)
    if (runs.empty() || runs.back() != b) runs.push_back(b);
  EXPECT_EQ(runs, (std::vector<std::string>{"h.2", "h.3", "h.0", "h.1"}));
  // The first block of a pair no longer keeps its output: its last residual add is recomputed too.
  EXPECT_GT(pairs.recompute.cloned_nodes, blocks.recompute.cloned_nodes);
  auto has = [](const Graph& g, const std::string& name) {
    return std::any_of(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.name == name; });
  };
  EXPECT_TRUE(has(pairs.model.graph, "h.0.residual_2 (recompute)"));
  EXPECT_FALSE(has(blocks.model.graph, "h.0.residual_2 (recompute)"));
  // Fewer, larger segments keep fewer block inputs but recompute more at once.
  EXPECT_NE(pairs.train.arena_bytes, blocks.train.arena_bytes);

  // every_k counts units: with k=2 only h.0-h.1 is checkpointed.
  base.push_back("activation_checkpointing.policy=every_k");
  base.push_back("activation_checkpointing.k=2");
  CompiledStep every = compile_step(quickstart(base).recipe);
  EXPECT_EQ(every.recompute.segments, 1);
  runs.clear();
  for (const std::string& b : recomputed_blocks(every.model.graph))
    if (runs.empty() || runs.back() != b) runs.push_back(b);
  EXPECT_EQ(runs, (std::vector<std::string>{"h.0", "h.1"}));
}

}  // namespace
}  // namespace engine
