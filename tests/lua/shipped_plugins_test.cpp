// The plugins in plugins/, and hooks in real training: each hook fires at its point, each action
// takes effect where docs/plugins.md says, a failing hook leaves the step unapplied.
#include <sstream>

#include "data/loader.h"
#include "golden/golden.h"
#include "lua_test_util.h"
#include "optim/optimizer.h"
#include "trainer/plugin_driver.h"
#include "trainer/session.h"
#include "trainer/train.h"

namespace engine::lua {
namespace {

using testing::temp_dir;
using testing::write_file;
using Json = nlohmann::json;

const std::string kSource = ENGINE_SOURCE_DIR;

std::unique_ptr<Plugin> shipped(const std::string& name, const Json& args, const Json& recipe = Json::object()) {
  auto plugin = std::make_unique<Plugin>(kSource + "/plugins/" + name, "plugins/" + name, 1);
  plugin->start(args, recipe);
  return plugin;
}

// A tiny MLP run; `plugins` is the YAML of the plugins section, relative to the temp directory.
recipe::LoadedRecipe tiny(const std::string& plugins, const std::string& extra = "", int steps = 8) {
  auto dir = temp_dir();
  std::string text = "run: {name: t, seed: 3, output_dir: " + (dir / "runs").string() +
                     "}\n"
                     "model: {arch: mlp, n_layer: 1, input_dim: 6, hidden_dim: 8, num_classes: 3}\n"
                     "data: {source: classification, num_samples: 256, prefetch: 0}\n"
                     "train: {steps: " +
                     std::to_string(steps) + ", micro_batch_size: 8, eval_every: 4, eval_batches: 2, log_every: 1}\n" +
                     "optimizer: {type: adamw, lr: 0.01}\n" + extra + "plugins: " + plugins + "\n";
  return recipe::load_recipe(write_file(dir / "r.yaml", text));
}

// Equal to within one rounding: the compiled schedule may fuse a multiply and an add (FMA), which
// Lua's arithmetic does not.
TEST(WarmupCosine, MatchesTheBuiltInSchedule) {
  auto loaded = recipe::load_recipe(kSource + "/recipes/golden/gpt_markov.yaml");
  const auto& r = loaded.recipe;
  auto plugin =
      shipped("warmup_cosine.lua", {{"warmup_steps", r.scheduler.warmup_steps}, {"min_lr", r.scheduler.min_lr}},
              recipe_values(loaded));
  PluginActions actions;
  for (int64_t step = 0; step < r.train.steps; ++step) {
    const double expected = learning_rate(r, step);
    EXPECT_NEAR(plugin->lr(step, r.optimizer.lr, {}, actions), expected, 5e-16 * expected) << "step " << step;
  }
}

TEST(WarmupCosine, TrainsAsTheBuiltInSchedule) {
  auto builtin = run_trajectory(recipe::load_recipe(kSource + "/recipes/golden/gpt_markov.yaml"));
  auto plugin = run_trajectory(recipe::load_recipe(kSource + "/recipes/golden/plugin_warmup_cosine.yaml"));
  ASSERT_EQ(builtin.steps.size(), plugin.steps.size());
  for (size_t i = 0; i < builtin.steps.size(); ++i) {
    EXPECT_NEAR(builtin.steps[i].lr, plugin.steps[i].lr, 5e-16 * builtin.steps[i].lr);
    EXPECT_NEAR(builtin.steps[i].loss, plugin.steps[i].loss, 1e-6 * builtin.steps[i].loss);
  }
}

TEST(EarlyStopping, StopsAfterPatienceEvaluationsWithoutImprovement) {
  auto plugin = shipped("early_stopping.lua", {{"patience", 2}, {"metric", "val_loss"}, {"min_delta", 0.0}});
  EXPECT_FALSE(plugin->on_eval({}, {{"val_loss", 2.0}}).stop);
  EXPECT_FALSE(plugin->on_eval({}, {{"val_loss", 1.5}}).stop);
  EXPECT_FALSE(plugin->on_eval({}, {{"val_loss", 1.6}}).stop);
  auto actions = plugin->on_eval({}, {{"val_loss", 1.7}});
  ASSERT_TRUE(actions.stop);
  EXPECT_NE(actions.stop->find("val_loss has not improved on 1.5000 for 2 evaluations"), std::string::npos);
  EXPECT_EQ(plugin->save_state(), (Json{{"best", 1.5}, {"bad", 2}}));
}

TEST(EarlyStopping, EndsARunEarly) {
  auto t = run_trajectory(
      tiny("[{path: " + kSource + "/plugins/early_stopping.lua, args: {patience: 1, min_delta: 10}}]", "", 20));
  EXPECT_EQ(t.steps.size(), 8u);  // best at the evaluation of step 4, none better by 10 at step 8
}

TEST(LossSpikeGuard, SkipsSpikesAndNonFiniteLosses) {
  auto plugin = shipped("loss_spike_guard.lua",
                        {{"window", 20}, {"threshold", 4.0}, {"min_history", 10}, {"max_consecutive", 3}});
  for (int i = 0; i < 12; ++i) EXPECT_FALSE(plugin->on_step_end({}, {{"loss", 2.0 + 0.01 * (i % 3)}}).skip);
  auto spike = plugin->on_step_end({}, {{"loss", 5.0}});
  ASSERT_TRUE(spike.skip);
  EXPECT_NE(spike.skip->find("standard deviations above the mean"), std::string::npos) << *spike.skip;
  EXPECT_TRUE(plugin->on_step_end({}, {{"loss", std::nan("")}}).skip);
  EXPECT_TRUE(plugin->on_step_end({}, {{"loss", 6.0}}).stop);  // three in a row
  Json saved = plugin->save_state();
  EXPECT_EQ(saved["skipped"], 3);
  EXPECT_EQ(saved["losses"].size(), 12u);  // spikes never enter the window
}

TEST(LogEvery, RecordsMetricsEveryNSteps) {
  auto plugin = shipped("log_every.lua", {{"every", 2}, {"smoothing", 0.5}, {"print", false}});
  TrainState s;
  s.step = 1;
  EXPECT_TRUE(plugin->on_step_end(s, {{"loss", 4.0}, {"lr", 0.1}}).metrics.empty());
  s.step = 2;
  s.tokens = 64;
  auto actions = plugin->on_step_end(s, {{"loss", 2.0}, {"lr", 0.1}});
  ASSERT_EQ(actions.metrics.size(), 4u);
  EXPECT_EQ(actions.metrics[0], (std::pair<std::string, double>("plugin/log_every/loss_ema", 3.0)));
  EXPECT_EQ(actions.metrics[1], (std::pair<std::string, double>("plugin/log_every/tokens_seen", 64.0)));
}

TEST(ReduceOnPlateau, TurnsEvaluationOnAndReducesTheRate) {
  auto plugin =
      shipped("reduce_on_plateau.lua",
              {{"patience", 1}, {"factor", 0.5}, {"min_lr", 0.0}, {"eval_every", 7}, {"checkpoint_best", true}},
              {{"optimizer", {{"lr", 0.2}}}});
  EXPECT_EQ(plugin->on_recipe({{"train", {{"eval_every", 0}}}}), (Json{{"train", {{"eval_every", 7}}}}));
  EXPECT_TRUE(plugin->on_recipe({{"train", {{"eval_every", 5}}}}).is_null());
  TrainState s;
  s.lr = 0.2;
  plugin->on_train_start(s);
  EXPECT_TRUE(plugin->on_eval(s, {{"val_loss", 1.0}}).checkpoint);
  auto actions = plugin->on_eval(s, {{"val_loss", 1.2}});
  EXPECT_EQ(actions.set_lr, std::optional<double>(0.1));
}

// ---- in training ----

const char* kRecorder = R"(
  function on_train_start(state) engine.log("train_start " .. state.step) end
  function on_step_start(state) engine.log("step_start " .. state.step) end
  function lr(step, base, state) engine.log("lr " .. step .. " " .. state.step) return base end
  function on_step_end(state, m) engine.log("step_end " .. state.step .. " " .. string.format("%.3f", m.lr)) end
  function on_eval(state, m) engine.log("eval " .. state.step) if state.step == 4 then engine.request_checkpoint() end end
  function on_checkpoint(state, path) engine.log("checkpoint " .. state.step) end
  function on_train_end(state, s) engine.log("train_end " .. s.steps) end
)";

std::string plugin_lines(const std::string& output) {
  std::string lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("rec.lua: ", 0) == 0) lines += line.substr(9) + "\n";
  return lines;
}

TEST(PluginsInTraining, EachHookFiresAtItsPoint) {
  auto dir = temp_dir();
  write_file(dir / "rec.lua", kRecorder);
  auto loaded = tiny("[rec.lua]", "", 4);
  std::ostringstream out;
  TrainSummary summary = train(loaded, out);
  EXPECT_EQ(plugin_lines(out.str()),
            "train_start 0\n"
            "step_start 1\nlr 0 1\nstep_end 1 0.010\n"
            "step_start 2\nlr 1 2\nstep_end 2 0.010\n"
            "step_start 3\nlr 2 3\nstep_end 3 0.010\n"
            "step_start 4\nlr 3 4\nstep_end 4 0.010\neval 4\ncheckpoint 4\n"
            "train_end 4.0\n")
      << out.str();
  // Asked for in on_eval of the last step: a full checkpoint of that step (the plugins' state is in
  // its manifest).
  EXPECT_TRUE(std::filesystem::exists(summary.run_dir / "checkpoints" / "step-4" / "manifest.json"));
  EXPECT_EQ(summary.last_checkpoint, summary.run_dir / "checkpoints" / "step-4");
}

TEST(PluginsInTraining, SetLrAppliesFromTheStepItIsAskedIn) {
  auto dir = temp_dir();
  write_file(dir / "p.lua",
             "function on_step_start(state) if state.step == 3 then engine.set_lr(0.0123) end end\n"
             "function on_step_end(state, m) if state.step == 6 then engine.set_lr(nil) end end\n");
  auto t = run_trajectory(tiny("[p.lua]"));
  EXPECT_EQ(t.steps[1].lr, 0.01);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(t.steps[i].lr, 0.0123) << i;
  EXPECT_EQ(t.steps[6].lr, 0.01);  // back to the schedule after step 6
}

TEST(PluginsInTraining, SkipStepLeavesTheWeightsAsTheyWere) {
  auto dir = temp_dir();
  write_file(dir / "skip.lua", "function on_step_end(state, m) engine.skip_step('test') end\n");
  write_file(dir / "zero.lua", "function on_step_start(state) engine.set_lr(0) end\n");
  auto skipped = run_trajectory(tiny("[skip.lua]"));
  auto zero_lr = run_trajectory(tiny("[zero.lua]"));
  auto trained = run_trajectory(tiny("[]"));
  EXPECT_EQ(skipped.weights_digest, zero_lr.weights_digest);  // no update is an update of size 0
  EXPECT_NE(skipped.weights_digest, trained.weights_digest);
}

TEST(PluginsInTraining, RequestStopEndsTheRunAfterTheStep) {
  auto dir = temp_dir();
  write_file(dir / "p.lua",
             "function on_step_end(state, m) if state.step == 3 then engine.request_stop('test') end end");
  auto loaded = tiny("[p.lua]");
  std::ostringstream out;
  TrainSummary summary = train(loaded, out);
  EXPECT_EQ(summary.steps, 3);
  EXPECT_TRUE(summary.interrupted);
  EXPECT_TRUE(std::filesystem::exists(summary.run_dir / "model.safetensors"));
  EXPECT_NE(out.str().find("step 3: stop requested by p.lua: test"), std::string::npos) << out.str();
}

TEST(PluginsInTraining, MetricsGoToMetricsJsonl) {
  auto dir = temp_dir();
  write_file(dir / "p.lua", "function on_step_end(state, m) engine.metric('double_loss', 2 * m.loss) end");
  std::ostringstream out;
  TrainSummary summary = train(tiny("[p.lua]", "", 2), out);
  std::ifstream in(summary.run_dir / "metrics.jsonl");
  int found = 0;
  for (std::string line; std::getline(in, line);)
    if (line.find("double_loss") != std::string::npos) ++found;
  EXPECT_EQ(found, 2);
}

// A plugin that records `loss` and `step` (a forger once wrote one loss line per step) cannot make a
// line that a reader of metrics.jsonl takes for the engine's: neither one that parses to a `loss` or
// `step` of the plugin's choosing, nor one that contains the text "loss" as a key.
TEST(PluginsInTraining, PluginMetricsCannotPassForTheEngines) {
  auto dir = temp_dir();
  write_file(dir / "p.lua",
             "function on_step_end(state, m) engine.metric('loss', 12345) engine.metric('step', 999) end\n"
             "function on_eval(state, m) engine.metric('val_loss', 12345) end\n");
  std::ostringstream out;
  TrainSummary summary = train(tiny("[p.lua]", "", 4), out);
  std::ifstream in(summary.run_dir / "metrics.jsonl");
  int engine_losses = 0, plugin_lines = 0, lines_with_loss_text = 0;
  for (std::string text; std::getline(in, text);) {
    Json line = Json::parse(text);
    ASSERT_TRUE(line.contains("step")) << text;
    EXPECT_GE(line["step"].get<int64_t>(), 1) << text;
    EXPECT_LE(line["step"].get<int64_t>(), 4) << text;
    for (const char* key : {"loss", "val_loss"}) {
      if (line.contains(key)) {
        EXPECT_NE(line[key], 12345) << text;
      }
    }
    if (text.find("\"loss\"") != std::string::npos) ++lines_with_loss_text;
    if (line.contains("loss")) ++engine_losses;
    if (line.contains("plugin/p/loss")) {
      ++plugin_lines;
      EXPECT_EQ(line["plugin/p/loss"], 12345) << text;
      EXPECT_EQ(line["plugin/p/step"], 999) << text;
    }
  }
  EXPECT_EQ(engine_losses, 4);  // log_every: 1
  EXPECT_EQ(lines_with_loss_text, engine_losses);
  EXPECT_EQ(plugin_lines, 4);
}

TEST(PluginsInTraining, OnRecipeChangesTheRun) {
  auto dir = temp_dir();
  write_file(dir / "p.lua", "function on_recipe(r) return {train = {steps = 2}} end");
  std::ostringstream out;
  EXPECT_EQ(train(tiny("[p.lua]"), out).steps, 2);
  EXPECT_NE(out.str().find("p.lua: on_recipe changed train.steps=2"), std::string::npos) << out.str();
}

// The attack as it was found: on_recipe pointed run.output_dir at a directory of the plugin's
// choosing and the engine wrote the whole run there. Now the run does not start, and nothing is
// written there.
TEST(PluginsInTraining, OnRecipeCannotRedirectTheRun) {
  auto dir = temp_dir();
  const auto elsewhere = dir / "chosen_by_the_plugin";
  write_file(dir / "p.lua", "function on_recipe(r) return {run = {output_dir = '" + elsewhere.string() + "'}} end");
  std::ostringstream out;
  std::string message = testing::plugin_error([&] { train(tiny("[p.lua]"), out); });
  EXPECT_NE(message.find("plugin p.lua, on_recipe: run.output_dir names a file or directory"), std::string::npos)
      << message;
  EXPECT_FALSE(std::filesystem::exists(elsewhere));
}

TEST(PluginsInTraining, AFailingHookDoesNotHalfApplyTheStep) {
  auto dir = temp_dir();
  write_file(dir / "p.lua", "function on_step_end(state, m) if state.step == 2 then error('boom') end end");
  auto loaded = tiny("[p.lua]");
  PluginDriver plugins(loaded, [](const std::string&) {});
  Session session(loaded.recipe);
  session.store.initialize(3);
  BatchLoader loader(*session.data, session.micro_batch, session.model.sequence, 0);
  auto digest = [&] {
    std::vector<char> bytes;
    for (size_t u = 0; u < session.model.graph.units().size(); ++u) {
      const char* data = reinterpret_cast<const char*>(session.store.master(u));
      bytes.insert(bytes.end(), data, data + session.store.range_size(u) * 4);
    }
    return bytes;
  };
  for (int64_t step = 0; step < 2; ++step) {
    Session::StepHooks hooks;
    hooks.before_update = [&](Session::StepResult& s) {
      return plugins.before_update(step, session.updates, s.loss, s.grad_norm, s.loss_scale, s.lr);
    };
    plugins.step_start(step);
    if (step == 0) {
      session.train_step(
          step, [&] { return loader.next(); }, hooks);
      continue;
    }
    auto before = digest();
    std::string message = testing::plugin_error([&] {
      session.train_step(
          step, [&] { return loader.next(); }, hooks);
    });
    EXPECT_NE(message.find("plugin p.lua, on_step_end: p.lua:1: boom"), std::string::npos) << message;
    EXPECT_EQ(before, digest());
    EXPECT_EQ(session.updates, 1);
  }
}

}  // namespace
}  // namespace engine::lua

namespace engine::lua {
namespace {

std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = popen(("(" + command + ") 2>&1").c_str(), "r");
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  pclose(pipe);
  return output;
}

TEST(PluginInfoCommand, PrintsDescriptionHooksAndParameters) {
  std::string out = run_command(std::string(ENGINE_BINARY) + " plugin info " + kSource + "/plugins/early_stopping.lua");
  EXPECT_NE(out.find("Stops the run when an evaluation metric has not improved"), std::string::npos) << out;
  EXPECT_NE(out.find("hooks: on_eval"), std::string::npos) << out;
  EXPECT_NE(out.find("patience         an integer >= 1              default 5"), std::string::npos) << out;
  std::string broken = run_command(std::string(ENGINE_BINARY) + " plugin info /nonexistent.lua; echo status $?");
  EXPECT_NE(broken.find("file not found"), std::string::npos) << broken;
  EXPECT_NE(broken.find("status 2"), std::string::npos) << broken;
}

}  // namespace
}  // namespace engine::lua
