#include "trainer/plugin_driver.h"

#include "core/launcher.h"

#include <cmath>
#include <ostream>


namespace engine {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

// The engine's loss-spike event (for on_anomaly): a loss this many standard deviations above the
// mean of the last kSpikeWindow accepted losses, once kSpikeHistory are known.
constexpr double kSpikeZ = 6;
constexpr size_t kSpikeWindow = 50, kSpikeHistory = 20;

std::optional<double> spike_z(const std::deque<double>& losses, double loss) {
  if (losses.size() < kSpikeHistory) return std::nullopt;
  double mean = 0, squares = 0;
  for (double l : losses) mean += l / double(losses.size());
  for (double l : losses) squares += (l - mean) * (l - mean);
  const double deviation = std::sqrt(squares / double(losses.size() - 1));
  if (deviation <= 0) return std::nullopt;
  double z = (loss - mean) / deviation;
  return z > kSpikeZ ? std::optional<double>(z) : std::nullopt;
}

}  // namespace

PluginDriver::PluginDriver(const recipe::LoadedRecipe& loaded, Note note) : original_(loaded), note_(std::move(note)) {
  if (loaded.recipe.plugins.empty()) return;
  plugins_ = lua::PluginSet::from_recipe(loaded);
  std::vector<std::string> applied;
  changed_ = plugins_.apply_on_recipe(loaded, &applied);
  for (const auto& change : applied)
    note_(change.substr(0, change.find(": ")) + ": on_recipe changed " + change.substr(change.find(": ") + 2));
  if (changed_) plugins_.set_recipe(*changed_);
  state_.world_size = recipe().world.size;
  state_.rank = launch_from_environment().rank;
  if (plugins_.has(lua::Hook::lr))
    note_("learning rate: from the lr hook of a plugin, in place of the recipe's scheduler");
}

void PluginDriver::record(const Json& line) {
  if (metrics_) *metrics_ << line.dump() << "\n";
}

void PluginDriver::apply(lua::PluginActions actions, int64_t step) {
  for (const auto& line : actions.log) note_(line);
  for (auto& metric : actions.metrics) step_metrics_.push_back(std::move(metric));
  if (actions.set_lr) {
    // Recorded in metrics.jsonl, not printed: a plugin may set the rate every step.
    lr_override_ = *actions.set_lr;
    record({{"step", step + 1}, {"event", "set_lr"}, {"lr", lr_override_ ? Json(*lr_override_) : Json()}});
  }
  if (actions.checkpoint) checkpoint_ = true;
  if (actions.stop && !stop_) {
    stop_ = actions.stop;
    note_("step " + std::to_string(step + 1) + ": stop requested by " + *stop_);
    record({{"step", step + 1}, {"event", "request_stop"}, {"reason", *stop_}});
  }
  if (actions.skip && !skip_) skip_ = actions.skip;
}

void PluginDriver::train_start() {
  if (!active()) return;
  state_.lr = recipe().recipe.optimizer.lr;
  start_ = std::chrono::steady_clock::now();
  apply(plugins_.on_train_start(state_), -1);
}

void PluginDriver::step_start(int64_t step) {
  if (!active()) return;
  state_.step = step + 1;
  skip_.reset();
  apply(plugins_.on_step_start(state_), step);
}

std::function<bool(Session::StepResult&)> PluginDriver::update_hook(int64_t step, const Session& session) {
  if (!active()) return {};
  return [this, step, &session](Session::StepResult& r) {
    return before_update(step, session.updates, r.loss, r.grad_norm, r.loss_scale, r.lr);
  };
}

bool PluginDriver::before_update(int64_t step, int64_t updates, double loss, double grad_norm, double loss_scale,
                                 double& lr) {
  if (!active()) return true;
  state_.loss = loss;
  state_.grad_norm = grad_norm;
  state_.loss_scale = loss_scale;
  lua::PluginActions actions;
  if (lr_override_)
    lr = *lr_override_;
  else if (auto planned = plugins_.lr(updates, recipe().recipe.optimizer.lr, state_, actions))
    lr = *planned;
  state_.lr = lr;
  apply(std::move(actions), step);
  if (plugins_.has(lua::Hook::on_anomaly)) {
    if (!std::isfinite(loss))
      apply(plugins_.on_anomaly(state_, {"nonfinite_loss", step + 1, loss, "the loss is not finite", true}), step);
    else if (auto z = spike_z(recent_losses_, loss))
      apply(plugins_.on_anomaly(state_, {"loss_spike", step + 1, loss,
                                         "the loss is " + std::to_string(*z) +
                                             " standard deviations above the mean "
                                             "of the last " +
                                             std::to_string(recent_losses_.size()) + " steps",
                                         true}),
            step);
  }
  apply(
      plugins_.on_step_end(state_, {{"loss", loss}, {"grad_norm", grad_norm}, {"lr", lr}, {"loss_scale", loss_scale}}),
      step);
  // The set_lr of on_step_end applies to this update already.
  if (lr_override_ && lr != *lr_override_) lr = state_.lr = *lr_override_;
  if (skip_) {
    note_("step " + std::to_string(step + 1) + ": update skipped by " + *skip_);
    record({{"step", step + 1},
            {"event", "skip_step"},
            {"loss", std::isfinite(loss) ? Json(loss) : Json()},
            {"reason", *skip_}});
    return false;
  }
  if (std::isfinite(loss)) {
    recent_losses_.push_back(loss);
    if (recent_losses_.size() > kSpikeWindow) recent_losses_.pop_front();
  }
  return true;
}

void PluginDriver::step_end(int64_t step, int64_t tokens, bool overflow, double loss_scale) {
  if (!active()) return;
  state_.tokens = tokens;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  state_.throughput = elapsed > 0 ? double(tokens) / elapsed : 0;
  if (overflow)
    apply(plugins_.on_anomaly(
              state_, {"overflow", step + 1, loss_scale, "fp16 gradients overflowed; the update was skipped", false}),
          step);
}

void PluginDriver::eval(int64_t step, double val_loss) {
  if (!active()) return;
  apply(plugins_.on_eval(state_, {{"val_loss", val_loss}}), step);
}

void PluginDriver::end_of_step(int64_t step) {
  if (!active() || step_metrics_.empty()) return;
  Json line = {{"step", step + 1}};
  for (const auto& [name, value] : step_metrics_) line[name] = value;
  record(line);
  step_metrics_.clear();
}

bool PluginDriver::take_checkpoint_request() {
  const bool requested = checkpoint_;
  checkpoint_ = false;
  return requested;
}

void PluginDriver::checkpoint_written(int64_t step, const fs::path& path) {
  if (active()) apply(plugins_.on_checkpoint(state_, path.string()), step - 1);
}

Json PluginDriver::save_state() {
  Json losses = Json::array();
  for (double l : recent_losses_) losses.push_back(l);
  return {{"plugins", active() ? plugins_.save_state() : Json::object()},
          {"recent_losses", losses},
          {"lr_override", lr_override_ ? Json(*lr_override_) : Json()}};
}

void PluginDriver::restore_state(const Json& saved) {
  if (active() && saved.contains("plugins")) plugins_.restore_state(saved.at("plugins"));
  recent_losses_.clear();
  for (const Json& l : saved.value("recent_losses", Json::array())) recent_losses_.push_back(l.get<double>());
  if (saved.contains("lr_override") && !saved.at("lr_override").is_null())
    lr_override_ = saved.at("lr_override").get<double>();
}

void PluginDriver::train_end(int64_t steps, double final_loss, double final_val_loss, bool interrupted) {
  if (!active()) return;
  state_.step = steps;
  apply(plugins_.on_train_end(state_, {{"steps", double(steps)},
                                       {"final_loss", final_loss},
                                       {"final_val_loss", final_val_loss},
                                       {"interrupted", interrupted ? 1.0 : 0.0}}),
        steps - 1);
}

}  // namespace engine
