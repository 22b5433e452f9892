// The host: each hook receives the documented arguments, each engine.* action comes back as the
// documented PluginActions, errors name file:line, hook and traceback, saved state round-trips.
#include <cmath>

#include "lua_test_util.h"

namespace engine::lua {
namespace {

using testing::load_plugin;
using testing::plugin_error;
using Json = nlohmann::json;

TrainState state_at(int64_t step) {
  TrainState s;
  s.step = step;
  s.epoch = 1;
  s.tokens = 4096 * step;
  s.loss = 2.5;
  s.lr = 1e-3;
  s.grad_norm = 0.75;
  s.loss_scale = 1024;
  s.throughput = 12345;
  s.rank = 0;
  s.world_size = 1;
  return s;
}

TEST(LuaHost, EveryHookFiresWithItsArguments) {
  auto plugin = load_plugin(R"(
    saved = {calls = {}}
    local function note(text) saved.calls[#saved.calls + 1] = text end
    function on_recipe(recipe) note("recipe " .. recipe.train.steps) end
    function on_train_start(state) note("start " .. state.step .. " " .. state.recipe.train.steps) end
    function on_step_start(state) note("step_start " .. state.step .. " " .. state.tokens .. " " .. state.epoch) end
    function lr(step, base_lr, state) note("lr " .. step .. " " .. base_lr .. " " .. state.step) return base_lr / 2 end
    function on_step_end(state, m) note("step_end " .. m.loss .. " " .. m.grad_norm .. " " .. state.loss_scale) end
    function on_eval(state, m) note("eval " .. m.val_loss) end
    function on_checkpoint(state, path) note("checkpoint " .. path) end
    function on_anomaly(state, e) note("anomaly " .. e.kind .. " " .. e.step .. " " .. tostring(e.before_update)) end
    function on_train_end(state, s) note("end " .. s.steps .. " " .. state.world_size .. " " .. state.rank) end
  )");
  EXPECT_EQ(plugin->info().hooks.size(), size_t(kHookCount));
  EXPECT_TRUE(plugin->on_recipe({{"train", {{"steps", 10}}}}).is_null());
  plugin->on_train_start(state_at(0));
  plugin->on_step_start(state_at(3));
  PluginActions actions;
  EXPECT_DOUBLE_EQ(plugin->lr(2, 0.004, state_at(3), actions), 0.002);
  plugin->on_step_end(state_at(3), {{"loss", 2.5}, {"grad_norm", 0.75}});
  plugin->on_eval(state_at(3), {{"val_loss", 2.25}});
  plugin->on_checkpoint(state_at(3), "runs/x/step-3");
  plugin->on_anomaly(state_at(3), {"loss_spike", 3, 9.5, "z-score 7", true});
  plugin->on_train_end(state_at(3), {{"steps", 3}});
  Json calls = plugin->save_state()["calls"];
  std::vector<std::string> expected = {"recipe 10",
                                       "start 0 10",
                                       "step_start 3 12288 1",
                                       "lr 2 0.004 3",
                                       "step_end 2.5 0.75 1024.0",
                                       "eval 2.25",
                                       "checkpoint runs/x/step-3",
                                       "anomaly loss_spike 3 true",
                                       "end 3.0 1 0"};
  ASSERT_EQ(calls.size(), expected.size()) << calls.dump();
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(calls[i], expected[i]);
}

TEST(LuaHost, StateHasTheDocumentedFields) {
  auto plugin = load_plugin(R"(
    function on_step_start(state)
      saved = {}
      for _, k in ipairs({"step", "epoch", "tokens", "loss", "lr", "grad_norm", "loss_scale", "throughput",
                          "rank", "world_size"}) do saved[k] = state[k] end
      saved.has_recipe = state.recipe ~= nil
      local n = 0
      for k in pairs(state) do n = n + 1 end
      saved.fields = n
    end)");
  plugin->on_step_start(state_at(7));
  Json s = plugin->save_state();
  EXPECT_EQ(s["step"], 7);
  EXPECT_EQ(s["tokens"], 7 * 4096);
  EXPECT_EQ(s["loss"], 2.5);
  EXPECT_EQ(s["lr"], 1e-3);
  EXPECT_EQ(s["grad_norm"], 0.75);
  EXPECT_EQ(s["loss_scale"], 1024.0);
  EXPECT_EQ(s["throughput"], 12345.0);
  EXPECT_EQ(s["world_size"], 1);
  EXPECT_EQ(s["has_recipe"], true);
  EXPECT_EQ(s["fields"], 11);  // ten values and recipe: pairs() sees through the read-only view
}

TEST(LuaHost, ActionsComeBackAsRequested) {
  auto plugin = load_plugin(R"(
    function on_step_end(state, m)
      engine.log("loss is", m.loss)
      print("printed")
      engine.metric("twice_loss", 2 * m.loss)
      engine.skip_step("spike")
      engine.set_lr(0.5)
      engine.request_checkpoint()
      engine.request_stop("enough")
    end
    function on_eval(state, m) engine.set_lr(nil) end)");
  PluginActions a = plugin->on_step_end(state_at(1), {{"loss", 1.5}});
  ASSERT_EQ(a.log.size(), 2u);
  EXPECT_EQ(a.log[0], "plugins/test.lua: loss is\t1.5");
  EXPECT_EQ(a.log[1], "plugins/test.lua: printed");
  ASSERT_EQ(a.metrics.size(), 1u);
  EXPECT_EQ(a.metrics[0], (std::pair<std::string, double>("plugin/test/twice_loss", 3.0)));
  EXPECT_EQ(a.skip, "plugins/test.lua: spike");
  EXPECT_EQ(a.set_lr, std::optional<double>(0.5));
  EXPECT_TRUE(a.checkpoint);
  EXPECT_EQ(a.stop, "plugins/test.lua: enough");
  PluginActions b = plugin->on_eval(state_at(1), {{"val_loss", 1}});
  ASSERT_TRUE(b.set_lr.has_value());
  EXPECT_FALSE(b.set_lr->has_value());  // back to the schedule
}

TEST(LuaHost, SkipStepOnlyBeforeTheUpdate) {
  auto plugin = load_plugin(
      "function on_step_start(state) engine.skip_step() end\n"
      "function on_anomaly(state, e) engine.skip_step(e.kind) end\n");
  auto message = plugin_error([&] { plugin->on_step_start(state_at(1)); });
  EXPECT_NE(message.find("engine.skip_step is only available in on_step_end"), std::string::npos) << message;
  EXPECT_NE(message.find("plugins/test.lua:1:"), std::string::npos) << message;

  auto other = load_plugin("function on_anomaly(state, e) engine.skip_step(e.kind) end\n");
  EXPECT_EQ(other->on_anomaly(state_at(1), {"nonfinite_loss", 1, NAN, "", true}).skip,
            "plugins/test.lua: nonfinite_loss");
  EXPECT_NE(plugin_error([&] {
              other->on_anomaly(state_at(1), {"overflow", 1, 0, "", false});
            }).find("not in on_anomaly"),
            std::string::npos);
}

TEST(LuaHost, OnRecipeMayOnlyLog) {
  auto plugin = load_plugin("function on_recipe(r) engine.request_stop('no') end");
  auto message = plugin_error([&] { plugin->on_recipe(Json::object()); });
  EXPECT_NE(message.find("engine.request_stop is not available in on_recipe"), std::string::npos) << message;
}

TEST(LuaHost, RuntimeErrorNamesFileLineHookAndTraceback) {
  auto plugin = load_plugin(
      "local function helper(x)\n  return x.missing.field\nend\n"
      "function on_step_end(state, m)\n  local v = helper({})\n  return v\nend\n");
  auto message = plugin_error([&] { plugin->on_step_end(state_at(1), {}); });
  EXPECT_NE(message.find("plugin plugins/test.lua, on_step_end: plugins/test.lua:2: attempt to index a nil value"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("stack traceback:"), std::string::npos) << message;
  EXPECT_NE(message.find("plugins/test.lua:5: in function 'on_step_end'"), std::string::npos) << message;
  // After a failure the plugin is not called again: the run stops.
  EXPECT_NE(plugin_error([&] { plugin->on_step_end(state_at(2), {}); }).find("not called again"), std::string::npos);
}

TEST(LuaHost, SyntaxErrorNamesFileAndLine) {
  auto message = plugin_error([] { load_plugin("function on_step_end(state)\n  local x = = 1\nend\n"); });
  EXPECT_NE(message.find("plugin plugins/test.lua, load: plugins/test.lua:2: unexpected symbol near '='"),
            std::string::npos)
      << message;
}

TEST(LuaHost, StateArgsAndEngineAreReadOnly) {
  for (const char* attack : {"state.step = 1", "state.recipe.train.steps = 1", "args.x = 1", "engine.log = print",
                             "rawset(state, 'step', 1)", "setmetatable(state, {})"}) {
    auto plugin = load_plugin(std::string("function on_step_start(state) ") + attack + " end");
    auto message = plugin_error([&] { plugin->on_step_start(state_at(1)); });
    EXPECT_TRUE(message.find("read-only") != std::string::npos || message.find("protected") != std::string::npos)
        << attack << ": " << message;
  }
}

TEST(LuaHost, LrMustReturnANumber) {
  auto plugin = load_plugin("function lr(step, base, state) return 'fast' end");
  PluginActions actions;
  auto message = plugin_error([&] { plugin->lr(0, 1, state_at(1), actions); });
  EXPECT_NE(message.find("lr must return a number, returned string"), std::string::npos) << message;
  auto negative = load_plugin("function lr(step, base, state) return -1 end");
  EXPECT_NE(plugin_error([&] { negative->lr(0, 1, state_at(1), actions); }).find("finite number >= 0"),
            std::string::npos);
}

TEST(LuaHost, ArgsReachThePlugin) {
  auto plugin = load_plugin("function on_train_start(state) saved = {p = args.patience, m = args.metric} end",
                            {{"patience", 5}, {"metric", "val_loss"}});
  plugin->on_train_start(state_at(0));
  EXPECT_EQ(plugin->save_state(), (Json{{"p", 5}, {"m", "val_loss"}}));
}

TEST(LuaHost, SavedStateRoundTripsThroughJson) {
  auto plugin = load_plugin(R"(
    saved = {count = 3, mean = 2.5, name = "x", flags = {true, false}, window = {1.5, 2, 3},
             nested = {deep = {deeper = "yes"}}, empty = {}})");
  Json saved = plugin->save_state();
  EXPECT_EQ(saved.dump(),
            R"({"count":3,"empty":{},"flags":[true,false],"mean":2.5,"name":"x","nested":{"deep":{"deeper":"yes"}},)"
            R"("window":[1.5,2,3]})");
  EXPECT_TRUE(saved["count"].is_number_integer());
  EXPECT_TRUE(saved["window"][0].is_number_float());

  // Restored into a fresh plugin (a resumed run), the plugin sees the same values and types.
  auto resumed = load_plugin(R"(
    saved = {}
    function on_train_start(state)
      assert(math.type(saved.count) == "integer" and saved.mean == 2.5 and saved.nested.deep.deeper == "yes")
      saved.count = saved.count + 1
    end)");
  resumed->restore_state(saved);
  resumed->on_train_start(state_at(0));
  EXPECT_EQ(resumed->save_state()["count"], 4);
}

TEST(LuaHost, SavedStateRefusesWhatJsonCannotHold) {
  for (auto [source, expected] : std::vector<std::pair<std::string, std::string>>{
           {"saved = {f = print}", "saved.f is a function"},
           {"saved = {x = 0/0}", "saved.x is"},
           {"saved = {[1] = 1, a = 2}", "saved mixes key types"},
           {"saved = {}; saved.self = saved", "nested more than 32 levels"}}) {
    auto plugin = load_plugin(source);
    auto message = plugin_error([&] { plugin->save_state(); });
    EXPECT_NE(message.find(expected), std::string::npos) << source << ": " << message;
  }
}

TEST(LuaHost, RandomIsSeededFromTheRun) {
  const char* source = "function on_train_start(state) saved = {math.random(1, 1000000), math.random()} end";
  auto a = load_plugin(source, Json::object(), testing::untimed_limits(), 42);
  auto b = load_plugin(source, Json::object(), testing::untimed_limits(), 42);
  auto c = load_plugin(source, Json::object(), testing::untimed_limits(), 43);
  for (auto* p : {a.get(), b.get(), c.get()}) p->on_train_start(state_at(0));
  EXPECT_EQ(a->save_state(), b->save_state());
  EXPECT_NE(a->save_state(), c->save_state());
}

// A resumed run starts a fresh plugin at step k: math.random must draw there what the run that
// never stopped drew at step k, whatever earlier steps drew.
TEST(LuaHost, RandomDependsOnTheStepNotOnEarlierCalls) {
  const char* source = R"(
    saved = {}
    function on_step_start(state) saved[#saved + 1] = math.random(1, 1000000000) end)";
  auto straight = load_plugin(source, Json::object(), testing::untimed_limits(), 42);
  for (int step = 1; step <= 4; ++step) straight->on_step_start(state_at(step));
  auto resumed = load_plugin(source, Json::object(), testing::untimed_limits(), 42);
  resumed->on_step_start(state_at(4));
  EXPECT_EQ(straight->save_state()[3], resumed->save_state()[0]);
  EXPECT_NE(straight->save_state()[2], straight->save_state()[3]);  // still a different draw per step
}

TEST(LuaHost, RandomseedWithASeedWorks) {
  auto plugin = load_plugin(R"(
    function on_train_start(state)
      math.randomseed(7); local a = math.random(1, 1000000)
      math.randomseed(7); local b = math.random(1, 1000000)
      saved = {same = a == b}
    end)");
  plugin->on_train_start(state_at(0));
  EXPECT_EQ(plugin->save_state(), (Json{{"same", true}}));
}

TEST(LuaHost, InfoListsDescriptionParamsAndHooks) {
  auto plugin = load_plugin(R"(
    description = "Example."
    params = {
      patience = {type = "integer", default = 5, min = 1, help = "Evaluations to wait."},
      metric = {type = "string", choices = {"val_loss", "loss"}, help = "What to watch."},
    }
    function on_eval(state, metrics) end)");
  const PluginInfo& info = plugin->info();
  EXPECT_EQ(info.description, "Example.");
  ASSERT_EQ(info.params.size(), 2u);
  EXPECT_EQ(info.params[0].name, "metric");
  EXPECT_TRUE(info.params[0].default_value.is_null());
  EXPECT_EQ(info.params[1].name, "patience");
  EXPECT_EQ(info.params[1].default_value, 5);
  ASSERT_EQ(info.hooks.size(), 1u);
  EXPECT_EQ(info.hooks[0], Hook::on_eval);
}

TEST(LuaHost, BadParameterDeclarationsAreErrors) {
  auto message = plugin_error([] { load_plugin("params = {n = {type = 'int'}}"); });
  EXPECT_NE(message.find("params.n.type must be one of integer"), std::string::npos) << message;
  message = plugin_error([] { load_plugin("params = {n = {type = 'integer', default = 0, min = 1}}"); });
  EXPECT_NE(message.find("params.n.default: expected an integer >= 1, found 0"), std::string::npos) << message;
}

TEST(LuaHost, HookTyposAreReported) {
  auto plugin = load_plugin("function on_step_ends(state) end");
  ASSERT_EQ(plugin->info().unknown_hooks.size(), 1u);
  EXPECT_EQ(plugin->info().unknown_hooks[0], "on_step_ends");
}

TEST(LuaHost, PluginSetMergesActionsInOrder) {
  PluginActions a, b;
  a.stop = "first";
  a.log = {"x"};
  b.stop = "second";
  b.log = {"y"};
  b.set_lr = std::optional<double>(0.1);
  a.merge(b);
  EXPECT_EQ(a.stop, "first");
  EXPECT_EQ(a.log, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(a.set_lr, std::optional<double>(0.1));
}

TEST(LuaHost, ChangesBecomeOverrides) {
  auto overrides = changes_to_overrides(Json{{"train", {{"steps", 100}}},
                                             {"optimizer.lr", 0.5},
                                             {"data", {{"source", "a \"b\""}}},
                                             {"optimizer", {{"betas", {0.9, 0.99}}}}},
                                        "p.lua");
  EXPECT_EQ(overrides, (std::vector<std::string>{"data.source=\"a \\\"b\\\"\"", "optimizer.betas=[0.9,0.99]",
                                                 "optimizer.lr=0.5", "train.steps=100"}));
  EXPECT_NE(plugin_error([] {
              changes_to_overrides(Json{{"plugins", Json::array()}}, "p.lua");
            }).find("plugins of a run cannot be changed"),
            std::string::npos);
}

}  // namespace
}  // namespace engine::lua
