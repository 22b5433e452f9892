// The plugin ABI in C++ terms: what the trainer hands to hooks and what hooks hand back.
//
// No Lua type appears here. The trainer fills a TrainState (a read-only `state` table in Lua),
// calls a hook through PluginSet (plugin.h) and applies the PluginActions it returns at the points
// docs/plugins.md documents:
//
//   TrainState state{.step = 12, .loss = 3.1, .lr = 3e-4};
//   PluginActions actions = plugins.on_step_end(state, {{"loss", 3.1}, {"grad_norm", 0.8}});
//   if (actions.skip) ...   // the update of step 12 is not applied
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace engine::lua {

// The hooks, in the order a run meets them. Each is optional in a plugin.
enum class Hook {
  on_recipe,
  on_train_start,
  on_step_start,
  lr,
  on_step_end,
  on_eval,
  on_checkpoint,
  on_anomaly,
  on_train_end
};
inline constexpr int kHookCount = 9;
const char* hook_name(Hook hook);
const std::vector<std::string>& hook_names();

// Limits per plugin; the defaults are documented in docs/plugins.md.
struct Limits {
  int64_t instructions = 20'000'000;  // Lua VM instructions per hook call
  double seconds = 0.5;               // wall clock per hook call
  size_t memory_bytes = 64u << 20;    // live allocations of the plugin's state
};

// A plugin failed (syntax, runtime error) or exceeded a limit; the run stops with this message.
class PluginError : public UserError {
 public:
  using UserError::UserError;
};

// What a hook sees as `state`. step is the 1-based number of the step in progress (on_step_start,
// lr, on_step_end, on_anomaly) or of the last step completed (on_eval, on_checkpoint, on_train_end);
// 0 in on_train_start. NaN where a value does not exist yet (loss before the first step).
struct TrainState {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  int64_t step = 0;
  int64_t epoch = 0;   // passes over the training data completed (0: the sources are endless streams)
  int64_t tokens = 0;  // tokens (or samples) seen by training so far
  double loss = kNone;
  double lr = kNone;
  double grad_norm = kNone;
  double loss_scale = 1;
  double throughput = 0;  // tokens (or samples) per second over the last logging window
  int64_t rank = 0;
  int64_t world_size = 1;
};

// Named numbers handed to a hook as a table: on_step_end's metrics, on_eval's, the summary.
using Metrics = std::vector<std::pair<std::string, double>>;

// on_anomaly's event: kind is "loss_spike", "overflow" or "nonfinite_loss".
struct AnomalyEvent {
  std::string kind;
  int64_t step = 0;
  double value = 0;            // the loss (or the loss scale, for overflow)
  std::string detail;          // a sentence for people
  bool before_update = false;  // the update of this step is not applied yet: skip_step() is allowed
};

// The key under which a plugin's engine.metric(name, value) is recorded: "plugin/<file>/<name>",
// <file> the plugin file's name without ".lua" (plugins/early_stopping.lua -> early_stopping), so
// that no plugin metric can pass for one of the engine's own (`loss`, `step`, ...) in metrics.jsonl
// and a dashboard's keys do not depend on where the recipe sits.
std::string plugin_metric_key(const std::string& plugin, const std::string& name);

// Everything the hooks of one dispatch asked for. Each request names its plugin for the log.
struct PluginActions {
  std::vector<std::string> log;                 // "plugins/x.lua: text"
  Metrics metrics;                              // engine.metric(name, value), keyed plugin_metric_key()
  std::optional<std::string> stop;              // engine.request_stop(reason): the first one
  bool checkpoint = false;                      // engine.request_checkpoint()
  std::optional<std::string> skip;              // engine.skip_step(reason)
  std::optional<std::optional<double>> set_lr;  // engine.set_lr(x); a null inner: back to the schedule

  void merge(PluginActions other);
  bool empty() const { return log.empty() && metrics.empty() && !stop && !checkpoint && !skip && !set_lr; }
};

}  // namespace engine::lua
