// Plugins and checkpoints: engine.request_checkpoint() writes a full checkpoint of the step it is
// asked in (after its evaluation, so a request from on_eval counts too); on_checkpoint runs once,
// after the checkpoint is committed, with its path; and a plugin's `saved` table comes back when
// the run resumes, so a plugin that counts its calls counts the same in a cut-and-resumed run as in
// a straight one.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../temp_dir.h"
#include "checkpoint/manifest.h"
#include "resume_util.h"

namespace engine::testing {
namespace {

namespace fs = std::filesystem;

fs::path write_plugin(const TempDir& dir, const std::string& source) {
  const fs::path path = dir / "counter.lua";
  std::ofstream(path) << source;
  return path;
}

// Counts on_step_end calls in `saved` and logs the count as a metric; asks for a checkpoint at step
// 2 (on_step_end) and at step 4 (on_eval); says where each checkpoint went.
const char* kCounter = R"(
  saved = {calls = 0}
  function on_step_end(state, m)
    saved.calls = saved.calls + 1
    engine.metric("calls", saved.calls)
    if state.step == 2 then engine.request_checkpoint() end
  end
  function on_eval(state, m) if state.step == 4 then engine.request_checkpoint() end end
  function on_checkpoint(state, path) engine.log("on_checkpoint " .. path) end
)";

std::vector<std::string> with_plugin(const fs::path& plugin, std::vector<std::string> more = {}) {
  more.push_back("plugins=[" + plugin.string() + "]");
  return more;
}

// The paths of the plugin's "<plugin>: on_checkpoint <path>" lines, in order.
std::vector<std::string> checkpoint_notes(const std::string& log) {
  std::vector<std::string> paths;
  std::istringstream in(log);
  const std::string marker = "counter.lua: on_checkpoint ";
  for (std::string line; std::getline(in, line);)
    if (auto at = line.find(marker); at != std::string::npos) paths.push_back(line.substr(at + marker.size()));
  return paths;
}

int64_t calls_at(const std::vector<nlohmann::json>& lines, int64_t step) {
  for (const nlohmann::json& j : lines)
    if (j.at("step") == step && j.contains("plugin/counter/calls")) return j.at("plugin/counter/calls").get<int64_t>();
  return -1;
}

TEST(PluginCheckpoints, RequestWritesAFullCheckpointAndOnCheckpointSeesItCommitted) {
  for (const char* async : {"checkpoint.async=true", "checkpoint.async=false"}) {
    SCOPED_TRACE(async);
    const TempDir dir("plugin_request");
    const fs::path plugin = write_plugin(dir, kCounter);
    std::ostringstream log;
    const TrainSummary s = train(tiny_recipe(dir.path(), with_plugin(plugin, {async, "checkpoint.keep_last=0"})), log);
    const fs::path checkpoints = s.run_dir / "checkpoints";
    // Requested in on_step_end (step 2) and in on_eval (step 4): each a committed checkpoint of
    // that step, with a manifest at that step, noticed by on_checkpoint once.
    const std::vector<std::string> expected = {(checkpoints / "step-2").string(), (checkpoints / "step-4").string()};
    EXPECT_EQ(checkpoint_notes(log.str()), expected) << log.str();
    for (const std::string& path : expected) {
      ASSERT_TRUE(fs::exists(fs::path(path) / kManifestName)) << path;
      EXPECT_EQ(read_manifest(path).step, path.back() - '0');
    }
    EXPECT_FALSE(fs::exists(checkpoints / "step-2" / "plugins.json"));  // the plugin state is in the manifest
    // metrics.jsonl records each checkpoint once.
    std::ifstream metrics(s.run_dir / "metrics.jsonl");
    int events = 0;
    for (std::string line; std::getline(metrics, line);) events += nlohmann::json::parse(line).contains("event");
    EXPECT_EQ(events, 2);
  }
}

// A checkpoint every step, written in the background: a write still in flight when the next one is
// due is committed first, and reported like any other (once in metrics.jsonl, once to on_checkpoint).
TEST(PluginCheckpoints, EveryCommittedCheckpointIsReportedOnce) {
  const TempDir dir("plugin_every");
  const fs::path plugin =
      write_plugin(dir, "function on_checkpoint(state, path) engine.log('on_checkpoint ' .. path) end");
  std::ostringstream log;
  const TrainSummary s =
      train(tiny_recipe(dir.path(), with_plugin(plugin, {"checkpoint.every_steps=1", "checkpoint.keep_last=0"})), log);
  std::vector<std::string> expected, events;
  for (int64_t step = 1; step <= kSteps; ++step)
    expected.push_back((s.run_dir / "checkpoints" / ("step-" + std::to_string(step))).string());
  EXPECT_EQ(checkpoint_notes(log.str()), expected) << log.str();
  std::ifstream metrics(s.run_dir / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (const auto j = nlohmann::json::parse(line); j.contains("event")) events.push_back(j.at("path"));
  EXPECT_EQ(events, expected);
}

TEST(PluginCheckpoints, SavedTableIsRestoredOnResume) {
  const TempDir dir("plugin_saved");
  const fs::path plugin = write_plugin(dir, kCounter);
  std::ostringstream log;
  train(tiny_recipe(dir / "straight", with_plugin(plugin)), log);
  const Trajectory straight = trajectory(dir / "straight" / "run");
  ASSERT_EQ(calls_at(straight.lines, kSteps), kSteps) << log.str();

  TrainOptions cut;
  cut.stop_after = kCut;
  train(tiny_recipe(dir / "cut", with_plugin(plugin)), log, cut);
  TrainOptions resume;
  resume.resume = "latest";
  EXPECT_EQ(train(tiny_recipe(dir / "cut", with_plugin(plugin)), log, resume).resumed_from, kCut);
  const Trajectory resumed = trajectory(dir / "cut" / "run");
  EXPECT_EQ(calls_at(resumed.lines, kSteps), kSteps);  // kSteps - kCut if `saved` were lost
  expect_same_run(resumed, straight, "with a plugin, cut and resumed");
}

}  // namespace
}  // namespace engine::testing
