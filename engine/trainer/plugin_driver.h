// PluginDriver: the recipe's Lua plugins (lua/plugin.h) at their fixed points of the training loop,
// and where each action a hook asks for takes effect. Without plugins every call is a no-op.
//
//   PluginDriver plugins(loaded, note);                  // loads them, runs on_recipe
//   const LoadedRecipe& recipe = plugins.recipe();       // the recipe to train (maybe changed)
//   plugins.train_start();
//   for each step:
//     plugins.step_start(step);                          // on_step_start
//     hooks.before_update = plugins.update_hook(step, session);   // lr, on_anomaly, on_step_end
//     plugins.step_end(step, ...);                       // metrics, overflow anomaly
//     plugins.eval(step, val_loss);                      // on_eval
//     plugins.end_of_step(step);                         // the step's plugin metrics
//     if (plugins.take_checkpoint_request()) ...         // a checkpoint of this step
//     plugins.checkpoint_written(step, path);            // on_checkpoint, once committed
//     if (plugins.stop_reason()) break;
//   plugins.train_end(summary);
//
// Where actions take effect (docs/plugins.md):
//   engine.set_lr(x)            from the update of the step in progress (when asked before it) on
//   engine.skip_step()          the update of the step in progress is not applied
//   engine.request_checkpoint() at the end of the step, after its evaluation
//   engine.request_stop()       after the step, its evaluation and checkpoint: weights are saved
//   engine.metric / engine.log  recorded in metrics.jsonl / printed when the hook returns
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>

#include "lua/plugin.h"
#include "recipe/load.h"
#include "trainer/session.h"

namespace engine {

class PluginDriver {
 public:
  using Note = std::function<void(const std::string&)>;

  PluginDriver(const recipe::LoadedRecipe& loaded, Note note);
  bool active() const { return !plugins_.empty(); }
  const recipe::LoadedRecipe& recipe() const { return changed_ ? *changed_ : original_; }
  // metrics.jsonl, for plugin metrics and actions; may stay unset (golden runs).
  void set_metrics(std::ostream* metrics) { metrics_ = metrics; }

  void train_start();
  // `step` is the 0-based index of the step; hooks see step + 1.
  void step_start(int64_t step);
  // Before the update: sets `lr` (set_lr, else the lr hook), runs on_anomaly for a non-finite loss or
  // a loss spike and on_step_end; false when a plugin skipped the update.
  bool before_update(int64_t step, int64_t updates, double loss, double grad_norm, double loss_scale, double& lr);
  // before_update as the session's StepHooks::before_update for step `step`; empty without plugins.
  std::function<bool(Session::StepResult&)> update_hook(int64_t step, const Session& session);
  // After the step: tokens seen (and throughput) for `state`; an fp16 overflow goes to on_anomaly.
  void step_end(int64_t step, int64_t tokens, bool overflow, double loss_scale);
  void eval(int64_t step, double val_loss);
  // Writes the step's plugin metrics line.
  void end_of_step(int64_t step);
  // Whether a plugin asked for a checkpoint during this step (engine.request_checkpoint); clears it.
  bool take_checkpoint_request();
  // A checkpoint of `step` steps was committed at `path`: on_checkpoint runs (the training loop
  // records the checkpoint in metrics.jsonl, once).
  void checkpoint_written(int64_t step, const std::filesystem::path& path);
  // What checkpoints keep of the plugins: their `saved` tables, the recent losses of loss-spike
  // detection and an lr set by engine.set_lr.
  nlohmann::json save_state();
  void restore_state(const nlohmann::json& saved);
  std::optional<std::string> stop_reason() const { return stop_; }
  void train_end(int64_t steps, double final_loss, double final_val_loss, bool interrupted);

 private:
  void apply(lua::PluginActions actions, int64_t step);
  void record(const nlohmann::json& line);

  const recipe::LoadedRecipe& original_;
  std::optional<recipe::LoadedRecipe> changed_;
  lua::PluginSet plugins_;
  Note note_;
  std::ostream* metrics_ = nullptr;
  lua::TrainState state_;
  std::optional<double> lr_override_;
  bool checkpoint_ = false;
  std::optional<std::string> stop_;
  std::optional<std::string> skip_;
  lua::Metrics step_metrics_;
  std::deque<double> recent_losses_;
  std::chrono::steady_clock::time_point start_;  // for the engine's own loss-spike detection
};

}  // namespace engine
